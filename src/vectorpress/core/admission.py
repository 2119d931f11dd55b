"""Admission control: one permit per input, refused at once when none is free."""

from __future__ import annotations

import asyncio
from collections import deque

from vectorpress.errors import OverloadedError


class Admission:
    """A counting semaphore with an all-or-nothing try-acquire of n permits.

    It lives on the server's single event loop (HTTP and gRPC share it), so it needs no lock.
    Streams use `acquire`, which waits in FIFO order instead of failing.
    """

    def __init__(self, permits: int) -> None:
        self.capacity = permits
        self.available = permits
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def try_acquire(self, n: int) -> None:
        if n > self.available or self._waiters:
            raise OverloadedError()
        self.available -= n

    async def acquire(self, n: int) -> None:
        n = min(n, self.capacity)
        if n <= self.available and not self._waiters:
            self.available -= n
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(n)  # granted just as we were cancelled
            else:
                self._waiters = deque(w for w in self._waiters if w[1] is not fut)
                self._wake()
            raise

    def release(self, n: int) -> None:
        self.available = min(self.capacity, self.available + n)
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.available:
            n, fut = self._waiters.popleft()
            if fut.done():
                continue
            self.available -= n
            fut.set_result(None)
