"""Batch formation: arrival order, token budget, request cap, abandoned entries dropped."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

from vectorpress.core.queue import BatchingQueue
from vectorpress.types import Encoding, Entry, OutputKind


@pytest.fixture
def loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def entry(loop: asyncio.AbstractEventLoop, n: int) -> Entry:
    return Entry(Encoding([1] * n, [0] * n), OutputKind.POOLED, loop.create_future(), loop)


def test_packs_in_arrival_order_under_token_budget(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchingQueue(max_batch_tokens=10, max_batch_requests=None, padded=False)
    entries = [entry(loop, n) for n in (4, 4, 3, 10, 1)]
    q.put(entries)
    assert q.next_batch() == entries[:2]
    assert q.next_batch() == entries[2:3]
    assert q.next_batch() == entries[3:4]
    assert q.next_batch() == entries[4:]
    assert q.next_batch(timeout=0.01) == []


def test_padded_cost_counts_max_len_times_n(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchingQueue(max_batch_tokens=12, max_batch_requests=None, padded=True)
    entries = [entry(loop, n) for n in (2, 2, 5, 1)]
    q.put(entries)
    assert q.next_batch() == entries[:2]  # adding 5 would cost 5 * 3 = 15
    assert q.next_batch() == entries[2:]  # 5 * 2 = 10


def test_request_cap_and_dropped_entries(loop: asyncio.AbstractEventLoop) -> None:
    dropped: list[int] = []
    q = BatchingQueue(
        max_batch_tokens=100, max_batch_requests=2, padded=False, on_dropped=dropped.append
    )
    entries = [entry(loop, 1) for _ in range(5)]
    entries[0].future.cancel()
    entries[2].future.cancel()
    q.put(entries)
    assert q.next_batch() == [entries[1], entries[3]]
    assert q.next_batch() == [entries[4]]
    assert sum(dropped) == 2


def test_an_entry_larger_than_the_budget_still_runs_alone(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchingQueue(max_batch_tokens=4, max_batch_requests=None, padded=False)
    big = entry(loop, 9)
    q.put([big, entry(loop, 1)])
    assert q.next_batch() == [big]


def _waiting(thread: threading.Thread) -> bool:
    """Whether `thread` is parked in a threading wait (a Condition's, or the lock under it)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "wait" and frame.f_code.co_filename == threading.__file__:
            return True
        frame = frame.f_back
    return False


def test_close_wakes_consumer(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchingQueue(max_batch_tokens=4, max_batch_requests=None, padded=False)
    got: list[object] = []
    consumer = threading.Thread(target=lambda: got.append(q.next_batch()), daemon=True)
    consumer.start()
    # The consumer must be blocked on the empty queue before close(), or the test would only
    # show that a closed queue returns None.
    deadline = time.monotonic() + 30
    while not _waiting(consumer):
        assert consumer.is_alive() and time.monotonic() < deadline, "consumer never blocked"
        time.sleep(0.005)
    q.close()
    consumer.join(30)
    assert not consumer.is_alive(), "close() did not wake the consumer"
    assert got == [None]
    assert q.next_batch() is None
