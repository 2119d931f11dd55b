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

With `runners` > 1 (backends that can run passes side by side: the torch backend on the CPU),
more units than one run at once when more work waits: the device thread and `runners - 1`
helper threads each take the next unit and run it on its share of the intra-op threads. On two
cores one OpenMP team of two threads waits at every op's barrier for a thread that the event
loop, the tokenizer or the client has preempted, so the server's own few percent of the CPU
cost the pass two to three times as much; two units on one thread each share no barrier, and a
preempted one loses only its own time. A unit that finds nothing else waiting and no other
runner busy runs on every thread, as with one runner, and the helpers wait for it: one request
in flight is not halved.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from vectorpress.backends import preemption
from vectorpress.backends.common.threads import num_threads
from vectorpress.core import giveway
from vectorpress.core.heap import HeapTrimmer
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


#: Waiting work of fewer tokens goes to one runner, wide, even while others are free: short
#: passes gain little from being cut.
SPLIT_MIN_TOKENS = 512


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


class _Trim:
    """The device has rested after work: hand freed heap pages back."""


class _Wakeups(threading.Condition):
    """The scheduler's lock and the device thread's wake-ups, which the queues share: a
    notification also wakes the helper runners (`helpers`, on the same lock), but only while a
    unit runs beside which they may take work. A helper woken for nothing would take the
    interpreter lock just as a lone query's pass starts (0.06 ms more server overhead on it)."""

    def __init__(self) -> None:
        lock = threading.Lock()
        super().__init__(lock)
        self.helpers = threading.Condition(lock)
        self.helpers_may_start: Callable[[], bool] = lambda: False

    def notify_all(self) -> None:
        super().notify_all()
        if self.helpers_may_start():
            self.helpers.notify_all()


class _RunnerState(threading.local):
    """What one runner (the device thread, a helper) is doing."""

    in_bulk = False
    nested = False
    wide = True
    threads = 0
    """The intra-op threads of its unit (0: none running)."""
    preempted_s = 0.0


class Scheduler:
    """Owns the device thread; every model's `BackendWorker` is added to it."""

    def __init__(
        self,
        thread: ModelThread | None = None,
        *,
        preempt: bool = True,
        interactive_burst_tokens: int = INTERACTIVE_BURST_TOKENS,
        runners: int = 1,
        trimmer: HeapTrimmer | None = None,
    ) -> None:
        from vectorpress.core.worker import ModelThread

        self.thread = thread or ModelThread()
        self.preempt = preempt
        """Run interactive work at the backends' preemption points (False: between units only)."""
        self.interactive_burst_tokens = interactive_burst_tokens
        self.cond = _Wakeups()
        self.alive = True
        """False once the device thread has died: every queue then refuses new work."""
        self.runners = max(1, runners)
        """Threads that run units (the device thread and helpers), where every model allows."""
        self._local = _RunnerState()
        self._helpers: list[threading.Thread] = []
        self._busy = 0
        """Runners in a unit or a call now (lock held)."""
        self._wide = False
        """A unit or call runs on every intra-op thread: no helper starts one (lock held)."""
        self._threads = 1
        """The intra-op threads of the device thread, read when its loop starts."""
        self._workers: list[BackendWorker] = []
        self._flows: dict[tuple[int, Lane], _Flow] = {}
        self._clock = {lane: 0.0 for lane in Lane}
        self._calls: list[_Call] = []
        self._running: Future[None] | None = None
        self._stopping = False
        self._streak = 0
        self._units: list[_Unit] = []
        """Units taken off the queues and not yet resolved (a bulk one and those inside it)."""
        self.trimmer = trimmer or HeapTrimmer()
        """Hands freed heap pages back: at rest, and under load when memory outgrows its
        allowance."""

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
            # Helpers only for a model that can use them: otherwise each would wake for
            # nothing at every change of the queues.
            new: list[threading.Thread] = []
            if worker.concurrent and not self._helpers:
                new = [
                    threading.Thread(target=self._helper, name=f"vp-runner-{i}", daemon=True)
                    for i in range(1, self.runners)
                ]
                self._helpers.extend(new)
                # Only now: a server without helpers pays no check per notification.
                self.cond.helpers_may_start = self._helpers_may_start
        if start:
            self._running = self.thread.submit(self._main)
        for helper in new:
            helper.start()

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
        """Close every model's queue, run what is queued, then end the threads."""
        for worker in list(self._workers):
            worker.queue.close()
        with self.cond:
            self._stopping = True
            self.cond.notify_all()
            running = self._running
        deadline = time.monotonic() + timeout
        if running is not None:
            try:
                running.result(timeout)
            except Exception:  # already logged by the loop, or it did not end in time
                log.warning("the device thread did not stop cleanly")
        for helper in self._helpers:
            helper.join(max(0.0, deadline - time.monotonic()))
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

    @property
    def preempted_s(self) -> float:
        """Seconds this runner spent in interactive work run inside bulk units (taken off
        their timings)."""
        return self._local.preempted_s

    @property
    def thread_share(self) -> float:
        """The share of the device's intra-op threads the unit on this runner runs on."""
        return self._local.threads / self._threads if self._local.threads else 1.0

    def _main(self) -> None:
        self._threads = torch.get_num_threads()
        with preemption.installed(self._preempt_point):
            try:
                while (job := self._next()) is not None:
                    if isinstance(job, _Call):
                        self._run_call(job)
                    elif isinstance(job, _Trim):
                        self.trimmer.trim()
                    else:
                        self._run_unit(job)
                        self.trimmer.after_unit()
            except BaseException:  # not a failed batch: the thread itself cannot go on
                log.exception("device thread died")
                self._die()
            finally:
                self.alive = False
                with self.cond:
                    self.cond.notify_all()

    def _helper(self) -> None:
        """A helper runner's loop: units only, on its share of the threads, while every model
        allows it and no unit runs wide."""
        with preemption.installed(self._preempt_point):
            try:
                while (unit := self._next_for_helper()) is not None:
                    self._run_unit(unit)
            except BaseException:
                log.exception("device runner died")
                self._die()

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

    def _drained(self) -> bool:
        return self._stopping or bool(self._workers and all(w.queue.closed for w in self._workers))

    def _side_by_side(self) -> bool:
        """Whether units may run beside each other now: several runners, every model's backend
        able to (lock held)."""
        return self.runners > 1 and all(w.concurrent for w in self._workers)

    def _next(self) -> _Call | _Unit | _Trim | None:
        """Block until there is something to run; None when stopping and all is drained.
        A call, and a unit that finds nothing else waiting and no helper busy, run wide; a
        trim once nothing has run for the trimmer's rest."""
        with self.cond:
            while self.alive:
                if self._calls and self._busy == 0:
                    call = self._calls.pop(0)
                    self._start(wide=True)
                    return call
                if not self._calls:
                    unit = self._pick(allow_bulk=True)
                    if unit is not None:
                        wide = not self._side_by_side() or (
                            self._busy == 0 and not self._work_waiting()
                        )
                        self._start(wide)
                        return unit
                    if self._drained():
                        return None
                rest = self.trimmer.rest_wait() if self._busy == 0 else None
                if rest == 0:
                    return _Trim()
                self.cond.wait(rest)
            return None

    def _helpers_may_start(self) -> bool:
        """Whether a helper may take a unit now (lock held): only beside a busy runner (a
        unit that finds every runner idle is the device thread's, which runs it on every
        thread if nothing else waits), none wide, no call waiting; or the end has come."""
        if self._stopping or not self.alive:
            return True
        return self._busy > 0 and not self._wide and not self._calls and self._side_by_side()

    def _next_for_helper(self) -> _Unit | None:
        with self.cond:
            while True:
                if self._drained() or not self.alive:
                    return None
                if self._helpers_may_start():
                    unit = self._pick(allow_bulk=True)
                    if unit is not None:
                        self._start(wide=False)
                        return unit
                self.cond.helpers.wait()

    def _work_waiting(self) -> bool:
        return any(self._ready(f) for f in self._flows.values())

    def _start(self, wide: bool) -> None:
        """This runner begins a unit or call (lock held)."""
        self._busy += 1
        self._wide = self._wide or wide
        self._local.wide = wide
        if not wide:
            self.cond.helpers.notify_all()  # a helper may take what waits

    def _release(self) -> None:
        """This runner's unit or call has ended (lock held)."""
        self._busy -= 1
        if self._local.wide:
            self._wide = False
        self.trimmer.worked()

    def _run_call(self, call: _Call) -> None:
        try:
            if not call.future.set_running_or_notify_cancel():
                return
            try:
                call.future.set_result(call.fn())
            except Exception as exc:  # handed to the caller
                call.future.set_exception(exc)
        finally:
            with self.cond:
                self._release()
                self.cond.notify_all()

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
        if bulk:
            self._streak = 0
        budget = flow.worker.pass_tokens if bulk else None
        idle = self.runners - self._busy
        queue = flow.worker.queue
        if idle > 1 and self._side_by_side() and queue.several_requests(lane):
            # Runners are free beside this one and requests keep coming: the waiting work is
            # shared out among them, which keeps each on its own threads. One request alone
            # runs wide: split in two, a sequential client's requests took 10-15% longer (the
            # halves end apart, and the first to end leaves its core idle).
            waiting = queue.waiting_tokens(lane)
            if waiting >= SPLIT_MIN_TOKENS:
                share = max(SPLIT_MIN_TOKENS // 2, -(-waiting // idle))
                budget = share if budget is None else min(budget, share)
        entries, cost = queue.take(lane, budget)
        if not bulk:
            self._streak += cost
        flow.vtime = start + cost / flow.worker.weight
        self._clock[lane] = start
        unit = _Unit(flow, entries, cost, start)
        self._units.append(unit)
        return unit

    def _run_unit(self, unit: _Unit, nested: bool = False) -> None:
        """Run a unit this runner started (`_start`); `nested`: one run at a preemption point,
        inside the runner's bulk unit, on its threads."""
        bulk = unit.flow.lane is Lane.BULK
        state = self._local
        outer_bulk, outer_threads = state.in_bulk, state.threads
        state.in_bulk = bulk
        if not nested:
            narrow = max(1, self._threads // self.runners)
            state.threads = self._threads if state.wide else narrow
        try:
            with num_threads(state.threads):
                if bulk:
                    unit.flow.worker.run(unit.entries)
                else:
                    with giveway.interactive_pass():
                        unit.flow.worker.run(unit.entries)
        finally:
            state.in_bulk, state.threads = outer_bulk, outer_threads
        # Not reached when the thread dies: the unit then stays listed, for `_die` to fail.
        with self.cond:
            self._units.remove(unit)
            if not nested:
                self._release()
            self.cond.notify_all()

    # -- preemption --------------------------------------------------------------------------

    def _interactive_waiting(self) -> bool:
        # Read without the lock: a stale answer only moves the switch to the next point.
        return any(w.queue.waiting(Lane.INTERACTIVE) for w in self._workers)

    def _preempt_point(self) -> None:
        """Called by a backend between layers: run waiting interactive work now."""
        state = self._local
        if not (self.preempt and state.in_bulk) or state.nested or not self._interactive_waiting():
            return
        state.nested = True
        started = time.perf_counter()
        try:
            while True:
                with self.cond:
                    unit = self._pick(allow_bulk=False)
                if unit is None:
                    break
                self._run_unit(unit, nested=True)
            # The bulk unit goes on: it counts as bulk progress for the burst rule.
            self._streak = 0
        finally:
            state.nested = False
            state.preempted_s += time.perf_counter() - started
