"""BatchingQueue: entries in arrival order, packed into batches under a token and request budget."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable

from vectorpress.errors import UnhealthyError
from vectorpress.types import Entry


class BatchingQueue:
    """A FIFO shared by the event loop (producer) and the backend worker thread (consumer).

    The budget counts real tokens for packed backends and `max_len * n` for padded ones. Every
    entry fits a batch on its own because start-up caps the max input length at the token
    budget, so the head of the queue can never block it.
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
        self._entries: deque[Entry] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._failed: BaseException | None = None
        self._on_dropped = on_dropped

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, entries: Iterable[Entry]) -> None:
        """Queue entries; raises the worker's failure once it has died, so nobody waits."""
        with self._cond:
            if self._failed is not None:
                raise UnhealthyError()
            self._entries.extend(entries)
            self._cond.notify()

    def close(self) -> None:
        """Wake the consumer and make `next_batch` return None once the queue is drained."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def next_batch(self, timeout: float | None = None) -> list[Entry] | None:
        """Block until entries are queued, then pop the next batch.

        Returns None when closed and empty, and [] when the timeout passed with nothing to do.
        """
        with self._cond:
            while True:
                dropped = self._drop_abandoned_head()
                if self._entries:
                    break
                if dropped and self._on_dropped:
                    self._on_dropped(dropped)
                    dropped = 0
                if self._closed:
                    return None
                if not self._cond.wait(timeout) and timeout is not None:
                    return []
            batch: list[Entry] = []
            max_len = 0
            tokens = 0
            while self._entries:
                entry = self._entries[0]
                if entry.abandoned:
                    self._entries.popleft()
                    dropped += 1
                    continue
                n = len(entry.encoding)
                cost = max(max_len, n) * (len(batch) + 1) if self.padded else tokens + n
                if batch and cost > self.max_batch_tokens:
                    break
                self._entries.popleft()
                batch.append(entry)
                max_len = max(max_len, n)
                tokens += n
                if self.max_batch_requests is not None and len(batch) >= self.max_batch_requests:
                    break
        if dropped and self._on_dropped:
            self._on_dropped(dropped)
        return batch

    def _drop_abandoned_head(self) -> int:
        dropped = 0
        while self._entries and self._entries[0].abandoned:
            self._entries.popleft()
            dropped += 1
        return dropped

    def fail_all(self, exc: BaseException) -> None:
        """Fail every waiting entry and every later `put` (the worker died)."""
        with self._cond:
            self._failed = exc
            entries = list(self._entries)
            self._entries.clear()
        for entry in entries:
            entry.loop.call_soon_threadsafe(_set_exception, entry, exc)


def _set_exception(entry: Entry, exc: BaseException) -> None:
    if not entry.future.done():
        entry.future.set_exception(exc)
