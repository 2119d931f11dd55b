"""Weights copied onto transparent huge pages (backends/common/huge_pages.py)."""

from __future__ import annotations

import gc

import pytest
import torch

from tests.helpers.pages import THP, huge_kib, thp_given
from vectorpress.backends.common.huge_pages import HUGE_PAGE, on_huge_pages


def test_the_copies_hold_the_values_in_one_aligned_mapping_that_outlives_its_names() -> None:
    gen = torch.Generator().manual_seed(0)
    originals = [
        torch.randn(700, 1300, generator=gen),
        torch.randn(5, generator=gen).to(torch.bfloat16),
        torch.randint(-128, 128, (3000, 1024), dtype=torch.int8, generator=gen),
        torch.randn(3, 7, generator=gen)[:, 1:5].contiguous(),
    ]
    copies = on_huge_pages(originals)
    gc.collect()
    assert copies[0].data_ptr() % HUGE_PAGE == 0
    for original, copy in zip(originals, copies, strict=True):
        assert copy.dtype == original.dtype and copy.shape == original.shape
        assert copy.data_ptr() % 64 == 0
        assert torch.equal(copy, original)
        assert copy.data_ptr() != original.data_ptr()
    # One mapping, in order, no copy overlapping the next.
    ends = [c.data_ptr() + c.numel() * c.element_size() for c in copies]
    assert all(end <= nxt.data_ptr() for end, nxt in zip(ends[:-1], copies[1:], strict=True))
    del originals
    gc.collect()
    assert int(copies[2].to(torch.int64).sum()) == int(copies[2].sum(dtype=torch.int64))
    copies[3].add_(1.0)  # private and writable
    if thp_given():
        assert huge_kib(copies[0].data_ptr()) >= HUGE_PAGE // 1024


def test_nothing_to_copy_gives_nothing() -> None:
    assert on_huge_pages([]) == []


@pytest.mark.skipif(
    not THP.exists() or "[madvise]" not in THP.read_text(),
    reason="Linux here does not give huge pages only where asked",
)
def test_only_the_copies_are_on_huge_pages() -> None:
    ordinary = torch.ones(8 << 20, dtype=torch.uint8)
    (huge,) = on_huge_pages([ordinary])
    assert huge_kib(huge.data_ptr()) >= 4096
    assert huge_kib(ordinary.data_ptr()) == 0
