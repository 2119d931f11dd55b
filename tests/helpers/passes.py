"""One CPU pass plan for every start-up inside a block, for tests that compare two servers (or a
server and an engine) to the bit.

Each start-up times its model on oneDNN and on F.linear and keeps the faster
(`backends.torch.passes.plan_passes`); two start-ups on a busy machine can pick differently, and
the two kernels (and the short passes' ONNX graph) differ in the last bits. Inside
`fixed_pass_plan()` both sides run oneDNN.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch


@contextlib.contextmanager
def fixed_pass_plan() -> Iterator[None]:
    from vectorpress.backends.torch import backend
    from vectorpress.backends.torch.passes import PassPlan

    def plan(encoder: Any, position_offset: int, **_: Any) -> PassPlan:
        encoder.fuse(True)
        return PassPlan(small_onednn=True, large_onednn=True)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(backend, "plan_passes", plan)
        yield


def timed_shortcuts(width: int) -> tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]:
    """Two stand-ins for a short-pass shortcut, for start-up's plan to time: one that returns
    at once, one far slower than a short pass on any machine, however loaded."""

    def instant(ids: torch.Tensor, *_: Any) -> torch.Tensor:
        return torch.zeros(len(ids), width)

    def slow(ids: torch.Tensor, *_: Any) -> torch.Tensor:
        time.sleep(0.2)
        return instant(ids)

    return instant, slow
