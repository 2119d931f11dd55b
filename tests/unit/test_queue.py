"""Batch formation: arrival order, token budget, request cap, abandoned entries dropped, lanes,
and what a closed or failed queue does with new entries."""

from __future__ import annotations

import asyncio

import pytest

from vectorpress.core.queue import BatchingQueue, Lane, LanePolicy, fail_entries, parse_priority
from vectorpress.errors import UnhealthyError, ValidationError
from vectorpress.types import Encoding, Entry, OutputKind


@pytest.fixture
def loop() -> asyncio.AbstractEventLoop:
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def entry(loop: asyncio.AbstractEventLoop, n: int) -> Entry:
    return Entry(Encoding([1] * n, [0] * n), OutputKind.POOLED, loop.create_future(), loop)


def take(q: BatchingQueue, lane: Lane = Lane.BULK, max_tokens: int | None = None) -> list[Entry]:
    return q.take(lane, max_tokens)[0]


def test_packs_in_arrival_order_under_token_budget(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchingQueue(max_batch_tokens=10, max_batch_requests=None, padded=False)
    entries = [entry(loop, n) for n in (4, 4, 3, 10, 1)]
    q.put(entries)
    assert take(q) == entries[:2]
    assert take(q) == entries[2:3]
    assert take(q) == entries[3:4]
    assert take(q) == entries[4:]
    assert take(q) == []


def test_padded_cost_counts_max_len_times_n(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchingQueue(max_batch_tokens=12, max_batch_requests=None, padded=True)
    entries = [entry(loop, n) for n in (2, 2, 5, 1)]
    q.put(entries)
    assert q.take(Lane.BULK) == (entries[:2], 4)  # adding 5 would cost 5 * 3 = 15
    assert q.take(Lane.BULK) == (entries[2:], 10)  # 5 * 2 = 10


def test_request_cap_and_dropped_entries(loop: asyncio.AbstractEventLoop) -> None:
    dropped: list[int] = []
    q = BatchingQueue(
        max_batch_tokens=100, max_batch_requests=2, padded=False, on_dropped=dropped.append
    )
    entries = [entry(loop, 1) for _ in range(5)]
    entries[0].future.cancel()
    entries[2].future.cancel()
    q.put(entries)
    assert take(q) == [entries[1], entries[3]]
    assert take(q) == [entries[4]]
    assert sum(dropped) == 2


def test_an_abandoned_entry_behind_a_live_one_is_dropped_once_it_reaches_the_head(
    loop: asyncio.AbstractEventLoop,
) -> None:
    dropped: list[int] = []
    q = BatchingQueue(
        max_batch_tokens=4, max_batch_requests=None, padded=False, on_dropped=dropped.append
    )
    live, gone, later = entry(loop, 4), entry(loop, 2), entry(loop, 2)
    q.put([live, gone, later])
    gone.future.cancel()
    with q._cond:
        assert q.has_work(Lane.BULK)  # the live head: nothing dropped yet
        assert dropped == []
        assert take(q) == [live]  # the budget ends the batch before the abandoned entry
        assert q.has_work(Lane.BULK)  # `later` still waits: the abandoned one is dropped
        assert dropped == [1]
        assert take(q) == [later]
        tail = entry(loop, 1)
        q.put([tail])
        tail.future.cancel()
        assert not q.has_work(Lane.BULK)  # only abandoned entries left: no batch to run
        assert dropped == [1, 1]
    assert q.waiting(Lane.BULK) == 0


def test_it_tells_whether_the_waiting_entries_are_one_requests(
    loop: asyncio.AbstractEventLoop,
) -> None:
    q = BatchingQueue(max_batch_tokens=100, max_batch_requests=None, padded=False)
    assert not q.several_requests(Lane.BULK)
    first, second = [entry(loop, 1) for _ in range(3)], [entry(loop, 1) for _ in range(4)]
    q.put(first)
    assert not q.several_requests(Lane.BULK)
    q.put(second)
    assert q.several_requests(Lane.BULK)
    assert not q.several_requests(Lane.INTERACTIVE)
    assert take(q, max_tokens=2) == first[:2]
    assert q.several_requests(Lane.BULK)  # the first request's last entry still waits
    assert take(q, max_tokens=2) == [first[2], second[0]]
    assert not q.several_requests(Lane.BULK)  # the rest of the second only
    # An abandoned head of an older request dropped: only the newest request's entries left.
    third = [entry(loop, 1) for _ in range(2)]
    q.put(third)
    for e in second[1:]:
        e.future.cancel()
    assert q.has_work(Lane.BULK)
    assert not q.several_requests(Lane.BULK)


def test_an_entry_larger_than_the_budget_still_runs_alone(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchingQueue(max_batch_tokens=4, max_batch_requests=None, padded=False)
    big = entry(loop, 9)
    q.put([big, entry(loop, 1)])
    assert take(q) == [big]


def test_lanes_are_separate_fifos_and_a_unit_budget_cuts_bulk(
    loop: asyncio.AbstractEventLoop,
) -> None:
    q = BatchingQueue(max_batch_tokens=100, max_batch_requests=None, padded=False)
    bulk = [entry(loop, 4) for _ in range(4)]
    query = entry(loop, 2)
    q.put(bulk, Lane.BULK)
    q.put([query], Lane.INTERACTIVE)
    assert q.waiting(Lane.INTERACTIVE) == 1 and q.waiting(Lane.BULK) == 4 and len(q) == 5
    assert take(q, Lane.INTERACTIVE) == [query]
    assert take(q, Lane.BULK, max_tokens=8) == bulk[:2]
    assert take(q, Lane.BULK) == bulk[2:]


def test_a_put_after_close_fails_at_once_and_queued_entries_stay(
    loop: asyncio.AbstractEventLoop,
) -> None:
    q = BatchingQueue(max_batch_tokens=4, max_batch_requests=None, padded=False)
    queued = entry(loop, 1)
    q.put([queued])
    q.close()
    with pytest.raises(UnhealthyError, match="shutting down"):
        q.put([entry(loop, 1)])
    assert take(q) == [queued]


def test_fail_all_fails_waiting_entries_and_later_puts(loop: asyncio.AbstractEventLoop) -> None:
    q = BatchingQueue(max_batch_tokens=4, max_batch_requests=None, padded=False)
    waiting = entry(loop, 1)
    q.put([waiting], Lane.INTERACTIVE)
    q.fail_all(UnhealthyError())
    loop.run_until_complete(asyncio.sleep(0))
    assert isinstance(waiting.future.exception(), UnhealthyError)
    with pytest.raises(UnhealthyError):
        q.put([entry(loop, 1)])


def test_failing_entries_of_a_closed_loop_is_safe() -> None:
    gone = asyncio.new_event_loop()
    orphan = entry(gone, 1)
    gone.close()
    fail_entries([orphan], UnhealthyError())  # nobody waits there: no error either


def test_lane_policy_and_priority_values() -> None:
    policy = LanePolicy(max_inputs=2, max_tokens=10)
    assert policy.lane(None, 2, 10) is Lane.INTERACTIVE
    assert policy.lane(None, 3, 10) is Lane.BULK
    assert policy.lane(None, 1, 11) is Lane.BULK
    assert policy.lane(Lane.INTERACTIVE, 30, 1000) is Lane.INTERACTIVE
    assert policy.lane(Lane.BULK, 1, 1) is Lane.BULK
    assert parse_priority(None) is None
    assert parse_priority(" Bulk") is Lane.BULK
    with pytest.raises(ValidationError, match="`priority` must be"):
        parse_priority("urgent")
