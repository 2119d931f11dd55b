"""glibc's heap, as the server sets it: how many malloc arenas, and handing freed pages back.

Torch-free: bench/tokenize_threads.py sets the same cap in its own processes.
"""

from __future__ import annotations

import contextlib
import ctypes
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


def limit_malloc_arenas(arenas: int) -> None:
    """Cap glibc's malloc arenas for threads created from now on.

    glibc gives each new thread its own arena (up to 8 per core); with the event loop, the
    worker and torch's pool all allocating tensors of ever-different sizes, each arena fragments
    separately, so the server keeps to one per thread that allocates much (`malloc_arenas`).
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, arenas)


class HeapTrimmer:
    """Hands freed heap pages back to the OS between batches, at most once a second.

    Batches of ever-different shapes leave glibc's arenas fragmented, and resident memory then
    creeps up under steady mixed traffic although nothing leaks; TEI trims for the same reason.
    """

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self.last = 0.0
        self._trim: Callable[[int], int] | None
        try:
            self._trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc: nothing to trim
            self._trim = None

    def maybe_trim(self) -> None:
        now = time.monotonic()
        if self._trim is not None and now - self.last >= self.every:
            self.last = now
            self._trim(0)
