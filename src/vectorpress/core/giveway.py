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

_count_lock = threading.Lock()
_running = 0
_idle = threading.Event()
_idle.set()
_local = threading.local()


@contextmanager
def interactive_pass() -> Iterator[None]:
    """Mark an interactive forward pass as running while the block runs (any thread)."""
    global _running
    with _count_lock:
        _running += 1
        _idle.clear()
    try:
        yield
    finally:
        with _count_lock:
            _running -= 1
            if _running == 0:
                _idle.set()


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
    if not _idle.is_set() and getattr(_local, "allowed", False):
        _idle.wait(GIVE_WAY_S)


def interactive_running() -> bool:
    return not _idle.is_set()
