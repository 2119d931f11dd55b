"""Intra-op thread counts, set around a block and restored after it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run the block on `n` intra-op threads, then restore the caller's count, so that nothing
    else in the process (another model, a reference encoder) is affected."""
    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
