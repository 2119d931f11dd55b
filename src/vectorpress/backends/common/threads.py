"""Intra-op thread counts, set around a block and restored after it."""

from __future__ import annotations

import torch


class _NumThreads:
    """A class rather than a generator: it runs around every pass on the device thread, with
    the caches cold, where a generator's context manager costs about three times the Python
    calls."""

    __slots__ = ("_before", "_n")

    def __init__(self, n: int) -> None:
        self._n = n
        self._before = n

    def __enter__(self) -> None:
        self._before = torch.get_num_threads()
        if self._n != self._before:
            torch.set_num_threads(self._n)

    def __exit__(self, *exc: object) -> None:
        if self._n != self._before:
            torch.set_num_threads(self._before)


def num_threads(n: int) -> _NumThreads:
    """Run the block on `n` intra-op threads, then restore the caller's count, so that nothing
    else in the process (another model, a reference encoder) is affected."""
    return _NumThreads(n)
