"""A test-only backend: a real backend with failures injected on demand."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import httpx

from vectorpress.backends.base import Backend
from vectorpress.backends.select import select_backend
from vectorpress.core import giveway
from vectorpress.model_spec import ModelSpec
from vectorpress.settings import ModelSettings
from vectorpress.types import Batch, BatchOutput


class WorkerKill(BaseException):
    """Not an Exception: ends the worker thread itself, as a fatal runtime fault would."""


class FaultyBackend:
    """Delegates to a real backend; `fail_if`, `oom_above`, `kill_next` and `delay` inject faults.

    Every batch it is asked to run is recorded (as lists of token ids) in `batches`.
    """

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = f"faulty-{inner.name}"
        self.dtype = inner.dtype
        self.device = inner.device
        self.is_padded = inner.is_padded
        self.max_batch_size = inner.max_batch_size
        # Its faults and records assume one batch at a time.
        self.concurrent_passes = False
        self.fail_if: Callable[[Batch], bool] | None = None
        self.oom_above: int | None = None
        self.kill_next = False
        self.delay = 0.0
        self.gate: threading.Event | None = None
        """When set, each forward pass waits for it (at most a minute)."""
        self.batches: list[list[list[int]]] = []
        self.events: list[tuple[str, int]] = []
        """("start", i) and ("end", i) for the i-th batch of `batches`, in the order they
        happened (a batch run inside another one's forward starts and ends between its two)."""
        self.interactive_marked: list[bool] = []
        """Whether each batch of `batches` ran marked as an interactive pass (core/giveway)."""
        self.started = threading.Event()
        self.started_at: list[float] = []
        """When each batch of `batches` started: orders batches of several backends."""

    def _inject(self, batch: Batch) -> int:
        cu = batch.cu_seqlens
        self.batches.append(
            [batch.input_ids[cu[i] : cu[i + 1]].tolist() for i in range(batch.size)]
        )
        index = len(self.batches) - 1
        self.started_at.append(time.perf_counter())
        self.events.append(("start", index))
        self.interactive_marked.append(giveway.interactive_running())
        self.started.set()
        if self.gate is not None:
            self.gate.wait(60)
        if self.delay:
            time.sleep(self.delay)
        if self.kill_next:
            self.kill_next = False
            raise WorkerKill()
        if self.fail_if is not None and self.fail_if(batch):
            raise RuntimeError("injected fault")
        if self.oom_above is not None and batch.size > self.oom_above:
            raise RuntimeError("CUDA out of memory (simulated)")
        return index

    def embed(self, batch: Batch) -> BatchOutput:
        index = self._inject(batch)
        out = self.inner.embed(batch)
        self.events.append(("end", index))
        return out

    def predict(self, batch: Batch) -> BatchOutput:
        index = self._inject(batch)
        out = self.inner.predict(batch)
        self.events.append(("end", index))
        return out

    def health(self) -> None:
        self.inner.health()


def faulty_factory() -> tuple[Callable[[ModelSpec, ModelSettings], Backend], list[FaultyBackend]]:
    """A backend factory for LiveServer, and a list that receives the backend it builds."""
    made: list[FaultyBackend] = []

    def make(spec: ModelSpec, settings: ModelSettings) -> Backend:
        backend = FaultyBackend(select_backend(spec, settings))
        made.append(backend)
        return backend

    return make, made


def leave_while_queued(url: str, text: str) -> int:
    """One client's input holds the worker (give the backend a `delay` first) while another
    posts `text` to /embed and leaves before it is computed; the status of the first."""

    async def scenario() -> int:
        async with httpx.AsyncClient(timeout=60) as client:
            busy = asyncio.ensure_future(
                client.post(f"{url}/embed", json={"inputs": "keeps the worker busy"})
            )
            await asyncio.sleep(0.3)
            gone = asyncio.ensure_future(client.post(f"{url}/embed", json={"inputs": text}))
            await asyncio.sleep(0.3)
            gone.cancel()  # the client leaves while its input waits in the queue
            return (await busy).status_code

    return asyncio.run(scenario())
