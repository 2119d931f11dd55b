"""grpc.health.v1 statuses that follow the backend, per service, as TEI sets them.

Info and Tokenize are always SERVING. The inference services the loaded model can answer start
NOT_SERVING and then follow the backend's health (embedding -> Embed; classifier -> Predict;
reranker -> Predict and Rerank); the others stay NOT_SERVING.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

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
    """Owns the health servicer and a task that re-checks the backend every `interval` s.

    The check is Infer.health(): free after a good batch, a 1-token forward pass after a failed
    one, so an idle healthy server costs nothing and a broken one is noticed within `interval`.
    """

    def __init__(self, infer: Infer, interval: float = 1.0) -> None:
        self.infer = infer
        self.interval = interval
        self.servicer = health.aio.HealthServicer()
        self.followed = BY_KIND[infer.spec.kind]
        self._healthy: bool | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.servicer.set("", SERVING)
        for name in ALWAYS:
            await self.servicer.set(name, SERVING)
        for name in INFERENCE:
            await self.servicer.set(name, NOT_SERVING)
        await self.check()
        self._task = asyncio.ensure_future(self._watch())

    async def check(self) -> bool:
        healthy = await self.infer.health()
        if healthy != self._healthy:
            self._healthy = healthy
            status = SERVING if healthy else NOT_SERVING
            for name in self.followed:
                await self.servicer.set(name, status)
            if not healthy:
                log.warning("backend unhealthy: gRPC %s NOT_SERVING", ", ".join(self.followed))
        return healthy

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
