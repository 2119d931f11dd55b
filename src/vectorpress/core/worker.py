"""ModelThread, the thread that makes every call into a backend, and BackendWorker, one model's
batches on it."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import queue as queue_module
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np

from vectorpress.core.queue import BatchingQueue
from vectorpress.core.scheduler import Scheduler
from vectorpress.errors import BackendError, VectorpressError
from vectorpress.types import Batch, BatchOutput, Entry

log = logging.getLogger(__name__)

BatchFn = Callable[[Batch], BatchOutput]
R = TypeVar("R")


class ModelThread:
    """The one thread that makes every call into a backend: loading, warm-up, then batches.

    libgomp gives each thread that starts parallel work its own team of OpenMP threads, and once
    it manages more threads than there are cores, idle team threads sleep at once instead of
    spinning, so every parallel op then pays a futex wake-up. Loading a model on the main thread
    and running it on a worker thread made two teams: a 16-token query took 13.4 ms on two
    threads instead of the 7.0 ms it takes when one thread both loads and runs the model.
    """

    def __init__(self, name: str = "vp-backend") -> None:
        self._calls: queue_module.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = (
            queue_module.SimpleQueue()
        )
        # A daemon: a worker blocked on its queue must never hold up the interpreter's exit.
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while (item := self._calls.get()) is not None:
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to the caller, whatever it is
                future.set_exception(exc)

    def submit(self, fn: Callable[[], R]) -> Future[R]:
        future: Future[R] = Future()
        self._calls.put((fn, future))
        return future

    def call(self, fn: Callable[[], R]) -> R:
        """Run `fn` on the thread and wait for its result (or exception)."""
        return self.submit(fn).result()

    def close(self) -> None:
        """End the thread once the calls already submitted have run."""
        self._calls.put(None)


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, MemoryError) or "out of memory" in str(exc).lower()


class BackendWorker:
    """One model on the scheduler's device thread: runs its batches on its backend and
    resolves the entries' futures.

    Any exception while a batch is handled (building the `Batch`, the forward pass, handing out
    the values, recording its metrics) fails only that batch's entries, and the thread goes on.
    Out of memory splits the batch and retries the halves before anyone fails. If the thread
    itself dies, `alive` turns false, waiting entries fail with Unhealthy, and later
    submissions are refused at once.
    """

    def __init__(
        self,
        queue: BatchingQueue,
        run_batch: BatchFn,
        on_batch: Callable[[Batch, float, bool], None] | None = None,
        scheduler: Scheduler | None = None,
        *,
        pass_tokens: int | None = None,
        weight: float = 1.0,
        concurrent: bool = False,
    ) -> None:
        self.queue = queue
        self.run_batch = run_batch
        self.on_batch = on_batch
        self.scheduler = scheduler or Scheduler()
        self.pass_tokens = pass_tokens or queue.max_batch_tokens
        """Most tokens in one bulk unit: the device can switch to other work between units."""
        if weight <= 0:
            raise ValueError("a model's scheduling weight must be positive")
        self.weight = weight
        """This model's share of the device against the others' when all have bulk work."""
        self.concurrent = concurrent
        """Whether the backend runs batches on several threads at once, each on the intra-op
        thread count of its own thread (the scheduler's runners)."""
        self.last_batch_ok = True
        self._stopped = False

    @property
    def alive(self) -> bool:
        """The device thread runs and this model has not been stopped."""
        return self.scheduler.alive and not self._stopped

    def start(self) -> None:
        self.scheduler.add(self)

    def stop(self, timeout: float = 30.0) -> None:
        """Take no more work, finish what is queued; the last model stopped ends the thread."""
        self.queue.close()
        self.scheduler.retire(self, timeout)
        self._stopped = True

    def run(self, entries: list[Entry]) -> None:
        """Run one batch of this model's entries (on the device thread)."""
        if not entries:
            return
        started = time.perf_counter()
        preempted = self.scheduler.preempted_s
        try:
            batch = Batch.from_encodings([e.encoding for e in entries], [e.kind for e in entries])
        except Exception as exc:
            self._fail(entries, None, exc, "building the batch")
            return
        try:
            output = self._forward(batch)
        except Exception as exc:
            self.last_batch_ok = False
            self._record(batch, started, preempted, False)
            self._fail(entries, batch, exc, "forward pass")
            return
        self.last_batch_ok = True
        elapsed = time.perf_counter() - started - (self.scheduler.preempted_s - preempted)
        try:
            values = _values(output, batch, len(entries))
        except Exception as exc:
            self._fail(entries, batch, exc, "handing out the outputs")
            return
        for entry in entries:
            entry.queue_time = started - entry.queued_at
            entry.inference_time = elapsed
        # The batch's metrics go with the answers, for the event loop to record once it has
        # written them: recorded here, they held the interpreter lock just as the loop woke for
        # the answers (a short query's hand-back 150 us instead of 70 on OpenVINO).
        record = None
        if self.on_batch is not None:
            busy = elapsed * self.scheduler.thread_share
            record = functools.partial(self._call_on_batch, batch, busy, True)
        _resolve(entries, values, None, record)

    def _record(self, batch: Batch, started: float, preempted: float, ok: bool) -> None:
        if self.on_batch is None:
            return
        elapsed = time.perf_counter() - started - (self.scheduler.preempted_s - preempted)
        self._call_on_batch(batch, elapsed * self.scheduler.thread_share, ok)

    def _call_on_batch(self, batch: Batch, busy: float, ok: bool) -> None:
        """`busy`: the batch's seconds times its share of the device's threads."""
        assert self.on_batch is not None
        try:
            self.on_batch(batch, busy, ok)
        except Exception:  # the batch's callers have their answers: only the metrics miss it
            log.exception("recording a batch's metrics failed")

    @staticmethod
    def _fail(entries: list[Entry], batch: Batch | None, exc: Exception, where: str) -> None:
        n = batch.size if batch is not None else len(entries)
        log.error("%s failed for a batch of %d inputs: %s", where, n, exc)
        message = exc.message if isinstance(exc, VectorpressError) else str(exc)
        _resolve(entries, [None] * len(entries), BackendError(f"Backend error: {message}"))

    def _forward(self, batch: Batch) -> BatchOutput:
        try:
            return self.run_batch(batch)
        except Exception as exc:
            if not _is_oom(exc) or batch.size == 1:
                raise
            log.warning("out of memory on a batch of %d inputs; retrying in halves", batch.size)
            return _join(self._forward(part) for part in _halves(batch))


def _values(output: BatchOutput, batch: Batch, n: int) -> list[Any]:
    values: list[Any] = [None] * n
    if output.pooled is not None:
        for row, index in enumerate(batch.pooled_indices):
            values[index] = output.pooled[row]
    for arr, index in zip(output.raw, batch.raw_indices, strict=True):
        values[index] = arr
    for parts, index in zip(output.multi, batch.multi_indices, strict=True):
        values[index] = parts
    return values


def _halves(batch: Batch) -> tuple[Batch, Batch]:
    mid = batch.size // 2
    cu = batch.cu_seqlens
    split = int(cu[mid])

    def part(lo: int, hi: int, t0: int, t1: int) -> Batch:
        return Batch(
            input_ids=batch.input_ids[t0:t1],
            token_type_ids=batch.token_type_ids[t0:t1],
            position_ids=batch.position_ids[t0:t1],
            cu_seqlens=(cu[lo : hi + 1] - cu[lo]).astype(np.int32),
            max_seqlen=int(np.diff(cu[lo : hi + 1]).max()),
            pooled_indices=tuple(i - lo for i in batch.pooled_indices if lo <= i < hi),
            raw_indices=tuple(i - lo for i in batch.raw_indices if lo <= i < hi),
            multi_indices=tuple(i - lo for i in batch.multi_indices if lo <= i < hi),
            key_lengths=None if batch.key_lengths is None else batch.key_lengths[lo:hi],
        )

    return part(0, mid, 0, split), part(mid, batch.size, split, batch.total_tokens)


def _join(outputs: Any) -> BatchOutput:
    parts = list(outputs)
    pooled = [p.pooled for p in parts if p.pooled is not None and len(p.pooled)]
    return BatchOutput(
        pooled=np.concatenate(pooled) if pooled else None,
        raw=[r for p in parts for r in p.raw],
        multi=[m for p in parts for m in p.multi],
    )


def _resolve(
    entries: list[Entry],
    values: list[Any],
    error: BaseException | None,
    after: Callable[[], None] | None = None,
) -> None:
    """Hand results to each entry's event loop in one callback per loop; `after` runs once, on
    the first loop that is still open, after what its woken callers do first (here if none is
    open)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Entry, Any]]] = defaultdict(list)
    for entry, value in zip(entries, values, strict=False):
        by_loop[entry.loop].append((entry, value))
    for loop, items in by_loop.items():
        # A closed loop means nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_set_all, items, error, after)
            after = None
    if after is not None:
        after()


def _set_all(
    items: list[tuple[Entry, Any]],
    error: BaseException | None,
    after: Callable[[], None] | None = None,
) -> None:
    for entry, value in items:
        if entry.future.done():
            continue
        if error is not None:
            entry.future.set_exception(error)
        else:
            entry.future.set_result(value)
    if after is not None:
        # Behind the wake-ups of the callers just answered: they write their answers first.
        asyncio.get_running_loop().call_soon(after)
