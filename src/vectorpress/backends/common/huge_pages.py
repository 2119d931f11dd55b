"""Weights the compiled kernels stream from memory on every pass, copied onto transparent huge
pages where Linux gives them.

A one-query pass reads every weight once and does little with each (all-MiniLM-L6-v2's 40.6 MiB
of float32 linears on 16 rows, more than the L3 holds): on 4 KiB pages the read crosses a page
every 4 KiB, each a TLB miss and a point where the cores' prefetchers stop, so the cores wait on
memory at every page. With the same weights on 2 MiB pages the float32 kernel's 16-token pass of
that model took 1.98-2.08 ms against 2.14-2.42 (p50, alternated, a C harness over the kernel on
six layers' own weights, the Zen 4 of 2026-12-07), and in the server's process 2.49 against 2.57
(the library call alone, alternated), the same values. Linux's default policy (`madvise`) gives
huge pages only to memory that asks for them, which torch's allocator does not.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Sequence

import torch

HUGE_PAGE = 2 << 20
ALIGN = 64  # each copy starts on a cache line


def on_huge_pages(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of `tensors`, in order, in one private anonymous mapping that starts on a huge
    page's boundary and asked Linux for huge pages before it was first written (where Linux has
    none to give, or never gives them, ordinary pages: the same copies). Each copy keeps the
    mapping alive."""
    sizes = [t.numel() * t.element_size() for t in tensors]
    offsets, total = [], 0
    for size in sizes:
        offsets.append(total)
        total += -(-size // ALIGN) * ALIGN
    # A huge page more than needed, so that the copies can start on one's boundary.
    length = -(-max(total, 1) // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE
    mem = mmap.mmap(-1, length, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        # OSError: a kernel built without transparent huge pages.
        with contextlib.suppress(OSError):
            mem.madvise(advice)
    raw = torch.frombuffer(mem, dtype=torch.uint8)
    start = -raw.data_ptr() % HUGE_PAGE
    copies = []
    for t, offset, size in zip(tensors, offsets, sizes, strict=True):
        dest = raw[start + offset : start + offset + size].view(t.dtype).view(t.shape)
        dest.copy_(t)
        copies.append(dest)
    return copies
