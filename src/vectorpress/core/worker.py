"""BackendWorker: the one thread that owns the model and runs every forward pass."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
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
from vectorpress.errors import BackendError, UnhealthyError, VectorpressError
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
    """Takes batches from the queue, runs them on the backend, resolves the entries' futures.

    An exception in a forward pass fails only that batch's entries. Out of memory splits the
    batch and retries the halves before anyone fails. If the thread itself dies, `alive` turns
    false, waiting entries fail with Unhealthy, and later submissions are refused at once.
    """

    def __init__(
        self,
        queue: BatchingQueue,
        run_batch: BatchFn,
        on_batch: Callable[[Batch, float, bool], None] | None = None,
        thread: ModelThread | None = None,
    ) -> None:
        self.queue = queue
        self.run_batch = run_batch
        self.on_batch = on_batch
        self.alive = False
        self.last_batch_ok = True
        self._thread = thread or ModelThread()
        self._running: Future[None] | None = None
        self._trimmer = _HeapTrimmer()

    def start(self) -> None:
        self.alive = True
        self._running = self._thread.submit(self._main)

    def stop(self, timeout: float = 30.0) -> None:
        """Finish what is queued, then end the thread."""
        self.queue.close()
        if self._running is not None:
            with contextlib.suppress(Exception):
                self._running.result(timeout)
        self._thread.close()

    def _main(self) -> None:
        entries: list[Entry] = []
        try:
            while True:
                batch = self.queue.next_batch()
                if batch is None:
                    return
                entries = batch
                if entries:
                    self._run(entries)
                    self._trimmer.maybe_trim()
                entries = []
        except BaseException:  # not a failed batch: the thread itself cannot go on
            log.exception("backend worker died")
            self.alive = False
            # The batch in hand was already taken off the queue: fail it too, or its callers
            # would wait forever.
            _resolve(entries, [None] * len(entries), UnhealthyError())
            self.queue.fail_all(UnhealthyError())
        finally:
            self.alive = False

    def _run(self, entries: list[Entry]) -> None:
        started = time.perf_counter()
        batch = Batch.from_encodings([e.encoding for e in entries], [e.kind for e in entries])
        try:
            output = self._forward(batch)
        except Exception as exc:
            self.last_batch_ok = False
            if self.on_batch is not None:
                self.on_batch(batch, time.perf_counter() - started, False)
            log.error("forward pass failed for a batch of %d inputs: %s", batch.size, exc)
            message = exc.message if isinstance(exc, VectorpressError) else str(exc)
            error = BackendError(f"Backend error: {message}")
            _resolve(entries, [None] * len(entries), error)
            return
        self.last_batch_ok = True
        elapsed = time.perf_counter() - started
        values: list[Any] = [None] * len(entries)
        if output.pooled is not None:
            for row, index in enumerate(batch.pooled_indices):
                values[index] = output.pooled[row]
        for arr, index in zip(output.raw, batch.raw_indices, strict=False):
            values[index] = arr
        for parts, index in zip(output.multi, batch.multi_indices, strict=False):
            values[index] = parts
        for entry in entries:
            entry.queue_time = started - entry.queued_at
            entry.inference_time = elapsed
        _resolve(entries, values, None)
        # After the hand-off: the event loop's thread takes a while to wake, time enough for this.
        if self.on_batch is not None:
            self.on_batch(batch, elapsed, True)

    def _forward(self, batch: Batch) -> BatchOutput:
        try:
            return self.run_batch(batch)
        except Exception as exc:
            if not _is_oom(exc) or batch.size == 1:
                raise
            log.warning("out of memory on a batch of %d inputs; retrying in halves", batch.size)
            return _join(self._forward(part) for part in _halves(batch))


_M_ARENA_MAX = -8  # glibc's mallopt parameter number


def limit_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas for threads created from now on.

    glibc gives each new thread its own arena (up to 8 per core); with tokenizer threads, the
    event loop, the worker and torch's pool all allocating tensors of ever-different sizes,
    each arena fragments separately and resident memory climbs under steady traffic
    (bench/soak.py measures it).
    """
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, arenas)


class _HeapTrimmer:
    """Hands freed heap pages back to the OS between batches, at most once a second.

    Batches of ever-different shapes leave glibc's arenas fragmented, and resident memory then
    creeps up under steady mixed traffic although nothing leaks; TEI trims for the same reason.
    """

    def __init__(self, every: float = 1.0) -> None:
        self.every = every
        self.last = 0.0
        self._trim: Callable[[int], int] | None
        try:
            self._trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc: nothing to trim
            self._trim = None

    def maybe_trim(self) -> None:
        now = time.monotonic()
        if self._trim is not None and now - self.last >= self.every:
            self.last = now
            self._trim(0)


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


def _resolve(entries: list[Entry], values: list[Any], error: BaseException | None) -> None:
    """Hand results to each entry's event loop in one callback per loop."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Entry, Any]]] = defaultdict(list)
    for entry, value in zip(entries, values, strict=False):
        by_loop[entry.loop].append((entry, value))
    for loop, items in by_loop.items():
        # A closed loop means nobody is waiting any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_set_all, items, error)


def _set_all(items: list[tuple[Entry, Any]], error: BaseException | None) -> None:
    for entry, value in items:
        if entry.future.done():
            continue
        if error is not None:
            entry.future.set_exception(error)
        else:
            entry.future.set_result(value)
