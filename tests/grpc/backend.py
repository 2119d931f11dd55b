"""A real backend behind a gate, so tests can hold batches in flight and inject failures."""

from __future__ import annotations

import threading
from collections.abc import Callable

from vectorpress.backends.base import Backend
from vectorpress.backends.select import select_backend
from vectorpress.model_spec import ModelSpec
from vectorpress.settings import ModelSettings
from vectorpress.types import Batch, BatchOutput


class WorkerDeath(BaseException):
    """Not an Exception: ends the worker thread, as a fatal runtime fault would."""


class GatedBackend:
    """Delegates every forward pass to the real backend once `gate` is set.

    `fail_next` makes the next forward raise (a failed batch); `kill_next` ends the worker
    thread. `entered` is set whenever a forward pass has started.
    """

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.name = inner.name
        self.dtype = inner.dtype
        self.device = inner.device
        self.is_padded = inner.is_padded
        self.max_batch_size = inner.max_batch_size
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fail_next = False
        self.kill_next = False

    def _pass(self) -> None:
        self.entered.set()
        if not self.gate.wait(60):
            raise RuntimeError("gate left closed")
        if self.kill_next:
            self.kill_next = False
            raise WorkerDeath()
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("injected forward failure")

    def embed(self, batch: Batch) -> BatchOutput:
        self._pass()
        return self.inner.embed(batch)

    def predict(self, batch: Batch) -> BatchOutput:
        self._pass()
        return self.inner.predict(batch)

    def health(self) -> None:
        self.inner.health()


def gated_factory() -> tuple[Callable[[ModelSpec, ModelSettings], Backend], list[GatedBackend]]:
    """A backend factory for LiveServer, and a list that receives the backend it builds."""
    made: list[GatedBackend] = []

    def make(spec: ModelSpec, settings: ModelSettings) -> Backend:
        backend = GatedBackend(select_backend(spec, settings))
        made.append(backend)
        return backend

    return make, made
