"""BatchingQueue: one model's entries in two lanes, packed into batches under a token budget."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from vectorpress.errors import UnhealthyError, ValidationError
from vectorpress.types import Entry


class Lane(str, Enum):
    """Which lane an input waits in: interactive work runs before bulk work."""

    INTERACTIVE = "interactive"
    BULK = "bulk"


SHUTTING_DOWN = "the server is shutting down and takes no new work"


class BatchingQueue:
    """A model's waiting entries, one FIFO per lane, shared by the event loop (producer) and the
    scheduler's device thread (consumer).

    The budget counts real tokens for packed backends and `max_len * n` for padded ones. Every
    entry fits a batch on its own because start-up caps the max input length at the token
    budget, so the head of a lane can never block it. The lock is the scheduler's (see
    `attach`), so that it sees every model's lanes at once.
    """

    def __init__(
        self,
        max_batch_tokens: int,
        max_batch_requests: int | None,
        padded: bool,
        on_dropped: Callable[[int], None] | None = None,
    ) -> None:
        self.max_batch_tokens = max_batch_tokens
        self.max_batch_requests = max_batch_requests
        self.padded = padded
        self._lanes: dict[Lane, deque[Entry]] = {lane: deque() for lane in Lane}
        self._newest: dict[Lane, int] = {lane: 0 for lane in Lane}
        """How many entries the lane's latest `put` (one request's) added, at its tail: while
        more wait than that, an older request's do too."""
        self._cond = threading.Condition()
        self._closed = False
        self._failed: BaseException | None = None
        self._on_dropped = on_dropped

    def attach(self, cond: threading.Condition) -> None:
        """Share the scheduler's lock and wake-ups (before any entry is put)."""
        self._cond = cond

    def __len__(self) -> int:
        return sum(len(d) for d in self._lanes.values())

    def waiting(self, lane: Lane) -> int:
        return len(self._lanes[lane])

    def several_requests(self, lane: Lane) -> bool:
        """Whether the lane's entries came from more than one request (`put`). Called with
        the lock held."""
        return len(self._lanes[lane]) > self._newest[lane]

    def waiting_tokens(self, lane: Lane) -> int:
        """The tokens of the lane's entries (abandoned ones included). Called with the lock
        held."""
        return sum(len(e.encoding) for e in self._lanes[lane])

    @property
    def closed(self) -> bool:
        return self._closed

    def put(self, entries: Iterable[Entry], lane: Lane = Lane.BULK) -> None:
        """Queue entries. Raises at once, so that nobody waits for what will never run, once
        the device thread has died or shutdown has begun (both Unhealthy)."""
        with self._cond:
            if self._failed is not None:
                raise UnhealthyError()
            if self._closed:
                raise UnhealthyError(SHUTTING_DOWN)
            before = len(self._lanes[lane])
            self._lanes[lane].extend(entries)
            self._newest[lane] = len(self._lanes[lane]) - before
            self._cond.notify_all()

    def close(self) -> None:
        """Take no more entries; those queued still run."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def has_work(self, lane: Lane) -> bool:
        """Whether the lane holds an entry someone still waits for (drops abandoned heads).

        Called with the lock held."""
        entries = self._lanes[lane]
        dropped = 0
        while entries and entries[0].abandoned:
            entries.popleft()
            dropped += 1
        if dropped:
            self._dropped(dropped)
        return bool(entries)

    def take(self, lane: Lane, max_tokens: int | None = None) -> tuple[list[Entry], int]:
        """Pop the lane's next batch in arrival order under `max_tokens` (the model's budget by
        default) and the request cap; returns it with its token cost. Called with the lock held.
        """
        budget = (
            self.max_batch_tokens if max_tokens is None else min(max_tokens, self.max_batch_tokens)
        )
        entries = self._lanes[lane]
        batch: list[Entry] = []
        max_len = 0
        tokens = 0
        cost = 0
        dropped = 0
        while entries:
            entry = entries[0]
            if entry.abandoned:
                entries.popleft()
                dropped += 1
                continue
            n = len(entry.encoding)
            next_cost = max(max_len, n) * (len(batch) + 1) if self.padded else tokens + n
            if batch and next_cost > budget:
                break
            entries.popleft()
            batch.append(entry)
            max_len = max(max_len, n)
            tokens += n
            cost = next_cost
            if self.max_batch_requests is not None and len(batch) >= self.max_batch_requests:
                break
        if dropped:
            self._dropped(dropped)
        return batch, cost

    def _dropped(self, n: int) -> None:
        if self._on_dropped is not None:
            # A metrics counter: it must not stop batching.
            with contextlib.suppress(Exception):
                self._on_dropped(n)

    def fail_all(self, exc: BaseException) -> None:
        """Fail every waiting entry and every later `put` (the device thread died)."""
        with self._cond:
            self._failed = exc
            entries = [e for lane in self._lanes.values() for e in lane]
            for lane in self._lanes.values():
                lane.clear()
        fail_entries(entries, exc)


def fail_entries(entries: Iterable[Entry], exc: BaseException) -> None:
    """Fail each entry's future on its own loop; a loop already closed has nobody waiting."""
    for entry in entries:
        with contextlib.suppress(RuntimeError):
            entry.loop.call_soon_threadsafe(_set_exception, entry.future, exc)


def _set_exception(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)


@dataclass(frozen=True)
class LanePolicy:
    """Which lane a request's inputs wait in when the request does not say."""

    max_inputs: int = 32
    max_tokens: int = 2048

    def lane(self, priority: Lane | None, n: int, tokens: int) -> Lane:
        if priority is not None:
            return priority
        if n <= self.max_inputs and tokens <= self.max_tokens:
            return Lane.INTERACTIVE
        return Lane.BULK


def parse_priority(value: str | None, what: str = "priority") -> Lane | None:
    """A request's `priority` field or `x-priority` header as a lane; None when absent."""
    if value is None:
        return None
    try:
        return Lane(value.strip().lower())
    except ValueError:
        raise ValidationError(
            f"Input validation error: `{what}` must be `interactive` or `bulk`, got {value!r}"
        ) from None
