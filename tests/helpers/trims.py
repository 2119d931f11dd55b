"""A heap trimmer that records its trims instead of calling glibc, for the scheduler's tests."""

from __future__ import annotations

from vectorpress.core.heap import HeapTrimmer


def recording_trimmer(rest_s: float) -> tuple[HeapTrimmer, list[int]]:
    """A trimmer that rests `rest_s` and whose memory never grows (so it trims only at rest),
    and the list each of its trims appends to."""
    trims: list[int] = []

    def trim(pad: int) -> int:
        trims.append(pad)
        return 1

    return HeapTrimmer(rest_s=rest_s, rss=lambda: 0, trim=trim), trims
