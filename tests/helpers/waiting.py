"""Waiting, bounded, for what another thread does (no timing is asserted)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(check: Callable[[], bool]) -> None:
    """Wait (at most 30 s) for something the device thread or the tokenizer pool does."""
    for _ in range(3000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never came true")
