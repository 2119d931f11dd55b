"""Scheduler: the one device thread for every served model, and what it runs next.

Two threads doing parallel CPU work make two OpenMP teams and halve speed, so every forward of
every model runs on one thread (`ModelThread`), and this class decides the order:

1. calls made through `call` (loading, warm-up) first;
2. interactive entries before bulk ones, across models by fair share, except that after
   `interactive_burst_tokens` of interactive work while bulk work waits, bulk gets its next
   unit (a flood of queries slows ingestion, never stops it);
3. bulk work by weighted fair share of token work across models (start-time fair queueing on
   each model's tokens / weight): a flooded model cannot starve another.

Bulk batches run in units of at most a model's `pass_tokens`, so the device can switch between
them; and while a bulk unit runs, the backend's preemption points (between layers) run waiting
interactive work on the spot (`backends/preemption.py`), so a query waits for one layer of a
pass, not for the whole batch.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from vectorpress.backends import preemption
from vectorpress.core import giveway
from vectorpress.core.queue import Lane, fail_entries
from vectorpress.errors import UnhealthyError
from vectorpress.types import Entry

if TYPE_CHECKING:
    from vectorpress.core.worker import BackendWorker, ModelThread

log = logging.getLogger(__name__)

R = TypeVar("R")

#: Interactive tokens run back to back while bulk work waits before a bulk unit goes: a query
#: flood then leaves bulk at least one unit in every few.
INTERACTIVE_BURST_TOKENS = 8192


@dataclass
class _Flow:
    """A model's lane as the fair queueing sees it: virtual work done (tokens / weight)."""

    worker: BackendWorker
    lane: Lane
    vtime: float = 0.0


@dataclass
class _Unit:
    flow: _Flow
    entries: list[Entry]
    cost: int
    start_tag: float


@dataclass
class _Call:
    fn: Callable[[], Any]
    future: Future[Any] = field(default_factory=Future)


class Scheduler:
    """Owns the device thread; every model's `BackendWorker` is added to it."""

    def __init__(
        self,
        thread: ModelThread | None = None,
        *,
        preempt: bool = True,
        interactive_burst_tokens: int = INTERACTIVE_BURST_TOKENS,
    ) -> None:
        from vectorpress.core.heap import HeapTrimmer
        from vectorpress.core.worker import ModelThread

        self.thread = thread or ModelThread()
        self.preempt = preempt
        """Run interactive work at the backends' preemption points (False: between units only)."""
        self.interactive_burst_tokens = interactive_burst_tokens
        self.cond = threading.Condition()
        self.alive = True
        """False once the device thread has died: every queue then refuses new work."""
        self.preempted_s = 0.0
        """Seconds spent in interactive work run inside bulk units (taken off their timings)."""
        self._workers: list[BackendWorker] = []
        self._flows: dict[tuple[int, Lane], _Flow] = {}
        self._clock = {lane: 0.0 for lane in Lane}
        self._calls: list[_Call] = []
        self._running: Future[None] | None = None
        self._stopping = False
        self._streak = 0
        self._in_bulk = False
        self._nested = False
        self._units: list[_Unit] = []
        """Units taken off the queues and not yet resolved (a bulk one and those inside it)."""
        self._trimmer = HeapTrimmer()

    # -- set-up ------------------------------------------------------------------------------

    def add(self, worker: BackendWorker) -> None:
        """Serve one more model; the device loop starts with the first."""
        with self.cond:
            if not self.alive:
                raise UnhealthyError()
            worker.queue.attach(self.cond)
            self._workers.append(worker)
            for lane in Lane:
                self._flows[(id(worker), lane)] = _Flow(worker, lane, self._clock[lane])
            start = self._running is None
        if start:
            self._running = self.thread.submit(self._main)

    def call(self, fn: Callable[[], R]) -> R:
        """Run `fn` on the device thread (loading, warm-up) and wait for its result; once
        batches run, it goes before the next unit."""
        with self.cond:
            running = self._running is not None
            if running:
                if not self.alive:
                    raise UnhealthyError()
                item = _Call(fn)
                self._calls.append(item)
                self.cond.notify_all()
        if not running:
            return self.thread.call(fn)
        result: R = item.future.result()
        return result

    def stop(self, timeout: float = 30.0) -> None:
        """Close every model's queue, run what is queued, then end the thread."""
        for worker in list(self._workers):
            worker.queue.close()
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
            running = self._running
        if running is not None:
            try:
                running.result(timeout)
            except Exception:  # already logged by the loop, or it did not end in time
                log.warning("the device thread did not stop cleanly")
        self.thread.close()

    def retire(self, worker: BackendWorker, timeout: float = 30.0) -> None:
        """Wait until `worker`'s (closed) queue has drained; the last model retired stops the
        thread."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while self.alive and (len(worker.queue) or self._has_unit_of(worker)):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.cond.wait(left)
            last = all(w.queue.closed for w in self._workers)
        if last:
            self.stop(max(0.0, deadline - time.monotonic()))

    def _has_unit_of(self, worker: BackendWorker) -> bool:
        return any(u.flow.worker is worker for u in self._units)

    # -- the device loop ---------------------------------------------------------------------

    def _main(self) -> None:
        with preemption.installed(self._preempt_point):
            try:
                while (job := self._next()) is not None:
                    if isinstance(job, _Call):
                        self._run_call(job)
                    else:
                        self._run_unit(job)
                        self._trimmer.maybe_trim()
            except BaseException:  # not a failed batch: the thread itself cannot go on
                log.exception("device thread died")
                self._die()
            finally:
                self.alive = False
                with self.cond:
                    self.cond.notify_all()

    def _die(self) -> None:
        with self.cond:
            self.alive = False
            units, self._units = self._units, []
            calls, self._calls = self._calls, []
            self.cond.notify_all()
        # The units in hand were already taken off the queues: fail them too, or their
        # callers would wait forever.
        for unit in units:
            fail_entries(unit.entries, UnhealthyError())
        for call in calls:
            call.future.set_exception(UnhealthyError())
        for worker in self._workers:
            worker.queue.fail_all(UnhealthyError())

    def _next(self) -> _Call | _Unit | None:
        """Block until there is something to run; None when stopping and all is drained."""
        with self.cond:
            while True:
                if self._calls:
                    return self._calls.pop(0)
                unit = self._pick(allow_bulk=True)
                if unit is not None:
                    return unit
                if self._stopping or (self._workers and all(w.queue.closed for w in self._workers)):
                    return None
                self.cond.wait()

    @staticmethod
    def _run_call(call: _Call) -> None:
        if not call.future.set_running_or_notify_cancel():
            return
        try:
            call.future.set_result(call.fn())
        except Exception as exc:  # handed to the caller
            call.future.set_exception(exc)

    def _pick(self, allow_bulk: bool) -> _Unit | None:
        """The next unit, taken off its queue (lock held). `allow_bulk` is False inside a bulk
        unit, which is then the bulk work that waits."""
        interactive = [
            f for f in self._flows.values() if f.lane is Lane.INTERACTIVE and self._ready(f)
        ]
        burst_spent = self._streak >= self.interactive_burst_tokens
        if not allow_bulk:
            return self._take(interactive, bulk=False) if interactive and not burst_spent else None
        bulk = [f for f in self._flows.values() if f.lane is Lane.BULK and self._ready(f)]
        if interactive and not (bulk and burst_spent):
            return self._take(interactive, bulk=False)
        return self._take(bulk, bulk=True) if bulk else None

    @staticmethod
    def _ready(flow: _Flow) -> bool:
        return flow.worker.queue.has_work(flow.lane)

    def _take(self, flows: list[_Flow], bulk: bool) -> _Unit:
        lane = flows[0].lane
        clock = self._clock[lane]
        # Start-time fair queueing: a flow that was idle starts at the clock, with no credit.
        flow = min(flows, key=lambda f: max(f.vtime, clock))
        start = max(flow.vtime, clock)
        budget = flow.worker.pass_tokens if bulk else None
        entries, cost = flow.worker.queue.take(lane, budget)
        flow.vtime = start + cost / flow.worker.weight
        self._clock[lane] = start
        unit = _Unit(flow, entries, cost, start)
        self._units.append(unit)
        return unit

    def _run_unit(self, unit: _Unit) -> None:
        bulk = unit.flow.lane is Lane.BULK
        if bulk:
            self._streak = 0
        else:
            self._streak += unit.cost
        outer_bulk = self._in_bulk
        self._in_bulk = bulk
        try:
            if bulk:
                unit.flow.worker.run(unit.entries)
            else:
                with giveway.interactive_pass():
                    unit.flow.worker.run(unit.entries)
        finally:
            self._in_bulk = outer_bulk
        # Not reached when the thread dies: the unit then stays listed, for `_die` to fail.
        with self.cond:
            self._units.remove(unit)
            self.cond.notify_all()

    # -- preemption --------------------------------------------------------------------------

    def _interactive_waiting(self) -> bool:
        # Read without the lock: a stale answer only moves the switch to the next point.
        return any(w.queue.waiting(Lane.INTERACTIVE) for w in self._workers)

    def _preempt_point(self) -> None:
        """Called by a backend between layers: run waiting interactive work now."""
        if not (self.preempt and self._in_bulk) or self._nested or not self._interactive_waiting():
            return
        self._nested = True
        started = time.perf_counter()
        try:
            while True:
                with self.cond:
                    unit = self._pick(allow_bulk=False)
                if unit is None:
                    break
                self._run_unit(unit)
            # The bulk unit goes on: it counts as bulk progress for the burst rule.
            self._streak = 0
        finally:
            self._nested = False
            self.preempted_s += time.perf_counter() - started
