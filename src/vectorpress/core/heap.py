"""glibc's heap, as the server sets it: how many malloc arenas, and handing freed pages back.

Torch-free: bench/tokenize_threads.py sets the same cap in its own processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import time
from collections.abc import Callable


def malloc_arenas(tokenizer_threads: int) -> int:
    """glibc malloc arenas for a server with `tokenizer_threads`: one for each thread that
    allocates much (the tokenizer pool's, the event loop, the model thread).

    Fewer arenas than threads allocating at once makes the threads queue on the arenas' locks:
    on 2 cores (bench/tokenize_threads.py), 4 threads tokenizing through 2 arenas took 1.04-1.54x
    the CPU per text of one thread (up to a sixth of it in the kernel), 8 threads 1.25-1.27x; with
    one arena per thread 1.00-1.09x, as with glibc's default. A 16-core GPU host's 15 tokenizer
    threads, on the 2 arenas the server kept before, spent about 10x a lone thread's CPU per
    text under load (bench/results/gpu.md). More arenas than threads only fragment memory
    further; one arena or two drew the same memory curve in the soak runs (docs/reliability.md).
    """
    return max(2, tokenizer_threads + 2)


_M_ARENA_MAX = -8  # glibc's mallopt parameter number


def _load_libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: no arenas to cap, nothing to trim
        return None


_LIBC = _load_libc()


def limit_malloc_arenas(arenas: int) -> None:
    """Cap glibc's malloc arenas for threads created from now on.

    glibc gives each new thread its own arena (up to 8 per core); with the event loop, the
    worker and torch's pool all allocating tensors of ever-different sizes, each arena fragments
    separately, so the server keeps to one per thread that allocates much (`malloc_arenas`).
    """
    if _LIBC is not None:
        with contextlib.suppress(AttributeError):
            _LIBC.mallopt(_M_ARENA_MAX, arenas)


#: Resident memory may grow this much past what a trim left before a trim runs under load: the
#: larger of a floor and a share of that size.
GROWTH_FLOOR = 256 * 2**20
GROWTH_SHARE = 0.25

#: Seconds the device must have had nothing to run before a trim at rest.
REST_S = 1.0


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def resident_bytes() -> int | None:
    """This process's resident memory, read from /proc (None where there is none)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


LIBC_TRIM: Callable[[int], int] | None = getattr(_LIBC, "malloc_trim", None)


class HeapTrimmer:
    """Hands freed heap pages back to the OS: once the device has been idle for `rest_s` after
    work, and under load only when resident memory has grown well past what the last trim left.

    Batches of ever-different shapes leave glibc's arenas fragmented, and resident memory then
    creeps up although nothing leaks (gigabytes of freed pages over a few hundred pass shapes,
    docs/reliability.md); TEI trims for the same reason. But a trim hands back pages the next
    batches fault in again (and the trim itself walks every arena): trimming once a second
    under load cost the float32 server 3-5% of its throughput (docs/performance.md). Under
    steady traffic the heap reaches a plateau below the growth allowance and is trimmed only
    when the traffic rests.

    Every runner calls `worked` when its unit or call ends (lock held: cheap); the device
    thread calls `after_unit` after its own units (lock not held) and `rest_wait` before it
    waits for work.
    """

    def __init__(
        self,
        every: float = 1.0,
        rest_s: float = REST_S,
        *,
        rss: Callable[[], int | None] = resident_bytes,
        trim: Callable[[int], int] | None = LIBC_TRIM,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every = every
        """Seconds between two reads of resident memory under load."""
        self.rest_s = rest_s
        self._rss = rss
        self._trim = trim
        self._clock = clock
        self._checked = clock()
        self._worked_at: float | None = None
        """When the last unit or call ended, if none has since the last trim."""
        self._limit: int | None = None
        """Resident bytes past which a trim runs under load (None until first read)."""
        self.trims = 0

    def worked(self) -> None:
        """A unit or call has ended: a trim is due once the device rests."""
        self._worked_at = self._clock()

    def after_unit(self) -> None:
        """Under load: trim if resident memory has outgrown its allowance (read at most once
        every `every` seconds)."""
        if self._trim is None:
            return
        now = self._clock()
        if now - self._checked < self.every:
            return
        self._checked = now
        rss = self._rss()
        if rss is None:
            return
        if self._limit is None:
            self._limit = self._allowance(rss)
        elif rss > self._limit:
            self.trim()

    def rest_wait(self) -> float | None:
        """Seconds until a trim at rest is due (0: now); None when none is (no work since the
        last trim)."""
        if self._trim is None or self._worked_at is None:
            return None
        return max(0.0, self._worked_at + self.rest_s - self._clock())

    def trim(self) -> None:
        if self._trim is None:
            return
        self._worked_at = None
        self._trim(0)
        self.trims += 1
        rss = self._rss()
        if rss is not None:
            self._limit = self._allowance(rss)

    @staticmethod
    def _allowance(rss: int) -> int:
        return rss + max(GROWTH_FLOOR, int(rss * GROWTH_SHARE))
