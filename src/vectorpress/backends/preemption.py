"""Preemption points: places inside a forward pass where the device thread may run other work.

A bulk batch on a CPU takes seconds; a query queued behind it would wait for all of it. The
scheduler installs a hook on its device thread, and a backend calls `point()` between the
layers of its forward (and mid-layer where the model allows): the hook runs whatever
interactive work waits, to the end, on the same thread, then returns, and the bulk pass goes on
from the activations it holds. Nothing else changes for the bulk pass: the same passes, the
same kernels, the same thread (so the same OpenMP team; a second thread would make a second
team and halve both).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch import nn

_local = threading.local()


def point() -> None:
    """Let the device thread's scheduler run waiting interactive work here, if any."""
    hook: Callable[[], None] | None = getattr(_local, "hook", None)
    if hook is not None:
        hook()


@contextmanager
def installed(hook: Callable[[], None]) -> Iterator[None]:
    """Make `hook` what `point()` calls on this thread while the block runs."""
    before = getattr(_local, "hook", None)
    _local.hook = hook
    try:
        yield
    finally:
        _local.hook = before


def _layer_list(module: nn.Module) -> nn.ModuleList | None:
    """The encoder's stack of layers: its longest ModuleList (embeddings and heads are not in
    lists; a Dense or pooling list is shorter than the layer stack in every supported model)."""
    best: nn.ModuleList | None = None
    for child in module.modules():
        if isinstance(child, nn.ModuleList) and (best is None or len(child) > len(best)):
            best = child
    return best


def add_layer_points(encoder: nn.Module) -> int:
    """A preemption point before each layer of `encoder` (a forward pre-hook: no model file
    changes, and it holds for the transformers fallback's modules too). Returns how many."""
    layers = _layer_list(encoder)
    if layers is None:
        return 0
    for layer in layers:
        layer.register_forward_pre_hook(lambda _module, _args: point())
    return len(layers)
