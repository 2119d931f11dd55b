"""When the device hands freed heap pages back: at rest after work, and under load only once
resident memory outgrows its allowance (a trim under load makes the next batches fault the
pages in again). The policy runs on a clock and a memory reading the test sets; the last test
trims this process's real glibc heap."""

from __future__ import annotations

import ctypes

import pytest

from vectorpress.core.heap import GROWTH_FLOOR, LIBC_TRIM, HeapTrimmer, resident_bytes

MiB = 2**20


class Heap:
    """A clock and a resident size the test moves; `trim` records its calls and shrinks the
    heap to `after_trim`."""

    def __init__(self, rss: int) -> None:
        self.now = 0.0
        self.rss = rss
        self.after_trim = rss
        self.trimmed_at: list[float] = []

    def clock(self) -> float:
        return self.now

    def read(self) -> int:
        return self.rss

    def trim(self, pad: int) -> int:
        assert pad == 0
        self.trimmed_at.append(self.now)
        self.rss = self.after_trim
        return 1

    def trimmer(self) -> HeapTrimmer:
        return HeapTrimmer(every=1.0, rest_s=1.0, rss=self.read, trim=self.trim, clock=self.clock)


def test_under_load_a_trim_runs_only_once_memory_outgrows_its_allowance() -> None:
    heap = Heap(500 * MiB)
    trimmer = heap.trimmer()
    for now, rss in ((1.0, 500), (2.0, 700), (3.0, 756)):  # the allowance: +256 MiB
        heap.now, heap.rss = now, rss * MiB
        trimmer.after_unit()
    assert heap.trimmed_at == []
    heap.now, heap.rss, heap.after_trim = 3.5, 900 * MiB, 600 * MiB
    trimmer.after_unit()  # read at most once a second
    assert heap.trimmed_at == []
    heap.now = 4.0
    trimmer.after_unit()
    assert heap.trimmed_at == [4.0]
    # The allowance now counts from what the trim left.
    heap.now, heap.rss = 5.0, 850 * MiB
    trimmer.after_unit()
    assert heap.trimmed_at == [4.0]
    heap.now, heap.rss = 6.0, 857 * MiB
    trimmer.after_unit()
    assert heap.trimmed_at == [4.0, 6.0]


def test_a_large_heap_may_grow_by_a_quarter_under_load() -> None:
    heap = Heap(4096 * MiB)
    trimmer = heap.trimmer()
    assert 1024 * MiB > GROWTH_FLOOR
    for now, rss in ((1.0, 4096), (2.0, 5120), (3.0, 5121)):
        heap.now, heap.rss = now, rss * MiB
        trimmer.after_unit()
    assert heap.trimmed_at == [3.0]


def test_a_trim_at_rest_is_due_once_the_device_has_rested_after_work() -> None:
    heap = Heap(500 * MiB)
    trimmer = heap.trimmer()
    assert trimmer.rest_wait() is None  # no work yet: nothing to hand back
    heap.now = 10.0
    trimmer.worked()
    heap.now = 10.25
    assert trimmer.rest_wait() == pytest.approx(0.75)
    trimmer.worked()  # more work: the rest starts again
    heap.now = 11.0
    assert trimmer.rest_wait() == pytest.approx(0.25)
    heap.now = 11.25
    assert trimmer.rest_wait() == 0
    trimmer.trim()
    assert heap.trimmed_at == [11.25]
    assert trimmer.rest_wait() is None  # trimmed: due again only after more work


def test_without_glibc_nothing_is_due() -> None:
    heap = Heap(500 * MiB)
    trimmer = HeapTrimmer(rss=heap.read, trim=None, clock=heap.clock)
    trimmer.worked()
    heap.now, heap.rss = 10.0, 10_000 * MiB
    trimmer.after_unit()
    assert trimmer.rest_wait() is None
    trimmer.trim()
    assert trimmer.trims == 0


@pytest.mark.skipif(LIBC_TRIM is None or resident_bytes() is None, reason="glibc on Linux only")
def test_a_trim_hands_the_freed_pages_of_a_fragmented_heap_back() -> None:
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    block, count = 16 * 1024, 12_800  # 200 MiB in blocks under glibc's mmap threshold
    blocks = [libc.malloc(block) for _ in range(count)]
    # Every 64th block stays, the last one included: the freed ones sit between them, where
    # free() alone gives nothing back.
    kept = blocks[63::64]
    try:
        for address in blocks:
            ctypes.memset(address, 1, block)
        for i, address in enumerate(blocks):
            if i % 64 != 63:
                libc.free(address)
        before = resident_bytes()
        trimmer = HeapTrimmer(every=0.0)
        trimmer.trim()
        after = resident_bytes()
        assert before is not None and after is not None
        assert trimmer.trims == 1
        assert before - after > 100 * MiB
    finally:
        for address in kept:
            libc.free(address)
