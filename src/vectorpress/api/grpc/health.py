"""grpc.health.v1 statuses that follow the backends, per service, as TEI sets them, and one
service per served model.

Info and Tokenize are always SERVING. The inference services the loaded models can answer start
NOT_SERVING and then follow the health of the models that answer them (embedding -> Embed;
classifier -> Predict; reranker -> Predict and Rerank: SERVING when every such model is
healthy); the others stay NOT_SERVING. Each model's served name is a service of its own that
follows that model alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from grpc_health.v1 import health, health_pb2

from vectorpress.core.infer import Infer

log = logging.getLogger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

ALWAYS = ("tei.v1.Info", "tei.v1.Tokenize")
BY_KIND = {
    "embedding": ("tei.v1.Embed",),
    "classifier": ("tei.v1.Predict",),
    "reranker": ("tei.v1.Predict", "tei.v1.Rerank"),
}
INFERENCE = ("tei.v1.Embed", "tei.v1.Predict", "tei.v1.Rerank")


class HealthWatcher:
    """Owns the health servicer and a task that re-checks every model every `interval` s.

    The check is Infer.health(): free after a good batch, a 1-token forward pass after a failed
    one, so an idle healthy server costs nothing and a broken one is noticed within `interval`.
    """

    def __init__(self, models: Sequence[tuple[str, Infer]], interval: float = 1.0) -> None:
        self.models = tuple(models)
        self.interval = interval
        self.servicer = health.aio.HealthServicer()
        self.followed = tuple(
            name for name in INFERENCE if any(name in BY_KIND[i.spec.kind] for _, i in models)
        )
        self._healthy: dict[str, bool] = {}
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.servicer.set("", SERVING)
        for name in ALWAYS:
            await self.servicer.set(name, SERVING)
        for name in INFERENCE:
            await self.servicer.set(name, NOT_SERVING)
        for name, _ in self.models:
            await self.servicer.set(name, NOT_SERVING)
        await self.check()
        self._task = asyncio.ensure_future(self._watch())

    async def check(self) -> bool:
        """Re-check every model; True when all are healthy."""
        results = await asyncio.gather(*(infer.health() for _, infer in self.models))
        healthy = {name: ok for (name, _), ok in zip(self.models, results, strict=True)}
        if healthy == self._healthy:
            return all(results)
        self._healthy = healthy
        for name, ok in healthy.items():
            await self.servicer.set(name, SERVING if ok else NOT_SERVING)
            if not ok:
                log.warning("model %s unhealthy: its gRPC health service is NOT_SERVING", name)
        for service in self.followed:
            ok = all(
                healthy[name] for name, infer in self.models if service in BY_KIND[infer.spec.kind]
            )
            await self.servicer.set(service, SERVING if ok else NOT_SERVING)
        return all(results)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except Exception:  # a failed check must not end the watch
                log.exception("backend health check failed")

    async def stop(self) -> None:
        """Every service NOT_SERVING (load balancers drain us), and the watch ends."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.servicer.enter_graceful_shutdown()
