"""Interactive forward passes go first for the interpreter lock.

An eager PyTorch forward lets go of the lock around every operator and takes it back after
each. Beside a thread that keeps the lock busy (one building a large answer: orjson holds it
for a whole call), each of the hundred-odd operators of a short query's pass then waits for a
forced switch, and the query's 4 ms pass took 20-48 ms while a 16-input `/embed_all` answer was
built. Work that can wait (answer builders off the event loop) calls `give_way()` between its
slices: while an interactive pass runs it sleeps, the lock free, until the pass ends or
`GIVE_WAY_S` has gone by, whichever is first, so it still moves beside a long interactive burst.

Bulk passes do not hold builders back: their answers are as much throughput as the pass.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

#: The longest one `give_way()` waits: a builder then gets a slice in at least every few ms.
GIVE_WAY_S = 0.002

_lock = threading.Lock()
_ended = threading.Condition(_lock)
"""Notified when the last interactive pass ends, only where a builder waits for it."""
_running = 0
_waiting = 0
_local = threading.local()


class _InteractivePass:
    """A class rather than a generator: it runs around every interactive pass on the device
    thread, with the caches cold, where a generator's context manager costs about three times
    the Python calls, and an Event's set and clear each run a condition's Python."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _running
        with _lock:
            _running += 1

    def __exit__(self, *exc: object) -> None:
        global _running
        with _lock:
            _running -= 1
            if _running == 0 and _waiting:
                _ended.notify_all()


_PASS = _InteractivePass()


def interactive_pass() -> _InteractivePass:
    """Mark an interactive forward pass as running while the block runs (any thread)."""
    return _PASS


@contextmanager
def may_give_way() -> Iterator[None]:
    """Let `give_way()` wait on this thread while the block runs: never on an event loop's."""
    before = getattr(_local, "allowed", False)
    _local.allowed = True
    try:
        yield
    finally:
        _local.allowed = before


def give_way() -> None:
    """Between slices of deferrable work: wait while an interactive pass runs (at most
    `GIVE_WAY_S`), if this thread allows it."""
    global _waiting
    if not _running or not getattr(_local, "allowed", False):
        return
    with _lock:
        if not _running:
            return
        _waiting += 1
        try:
            _ended.wait(GIVE_WAY_S)
        finally:
            _waiting -= 1


def interactive_running() -> bool:
    return _running > 0
