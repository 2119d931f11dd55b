"""The grpc.aio server: TEI's services, health and reflection, on the HTTP server's event loop.

It must run on the same loop as uvicorn: admission permits live on that one loop and are
shared by both dialects.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2

from vectorpress.api.grpc.auth import ApiKeyInterceptor
from vectorpress.api.grpc.decoding import DecodeInterceptor
from vectorpress.api.grpc.health import HealthWatcher
from vectorpress.api.grpc.services import add_services
from vectorpress.api.grpc.stubs import POOL, SERVICES
from vectorpress.api.state import AppState
from vectorpress.errors import StartupError

log = logging.getLogger(__name__)

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name


def _add_to_pool(*files: Any) -> None:
    """Reflection answers from one pool: add health and reflection beside tei.v1."""
    for file in files:
        try:
            POOL.FindFileByName(file.name)
        except KeyError:
            POOL.AddSerializedFile(file.serialized_pb)


_add_to_pool(health_pb2.DESCRIPTOR, reflection_pb2.DESCRIPTOR)


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class GrpcServer:
    """Start with `await GrpcServer.start(...)`; `port` is the bound port (useful with 0)."""

    def __init__(self, server: grpc.aio.Server, health: HealthWatcher, port: int) -> None:
        self.server = server
        self.health = health
        self.port = port
        self._stopped = False

    @classmethod
    async def start(
        cls,
        state: AppState,
        host: str,
        port: int,
        *,
        api_key: str | None = None,
        max_parallel_stream_requests: int = 1024,
    ) -> GrpcServer:
        interceptors: list[grpc.aio.ServerInterceptor] = []
        if state.tracer is not None:
            from vectorpress.observability.middleware import GrpcTracingInterceptor

            # First, so the call's span (under the caller's traceparent) covers the key check.
            interceptors.append(GrpcTracingInterceptor(state.tracer))
        if api_key:
            interceptors.append(ApiKeyInterceptor(api_key, SERVICES))
        # After the key check: nothing is decoded for a caller without the key.
        interceptors.append(DecodeInterceptor(SERVICES))
        server = grpc.aio.server(
            interceptors=interceptors,
            # A port already taken must fail start-up, not be shared with another process.
            options=[("grpc.so_reuseport", 0)],
        )
        add_services(server, state, max_parallel_stream_requests)
        watcher = HealthWatcher([(m.name, m.infer) for m in state.models])
        health_pb2_grpc.add_HealthServicer_to_server(watcher.servicer, server)
        reflection.enable_server_reflection(
            (*SERVICES, HEALTH_SERVICE, reflection.SERVICE_NAME), server, pool=POOL
        )
        bound = server.add_insecure_port(_address(host, port))
        if bound == 0:
            raise OSError(f"cannot bind gRPC to {_address(host, port)}")
        await watcher.start()
        await server.start()
        log.info("Ready: gRPC listening on %s", _address(host, bound))
        return cls(server, watcher, bound)

    @classmethod
    async def from_settings(cls, state: AppState) -> GrpcServer:
        """Start on --hostname:--grpc-port; a port that cannot be bound stops start-up."""
        settings = state.server
        assert settings.grpc_port is not None
        try:
            return await cls.start(
                state,
                settings.hostname,
                settings.grpc_port,
                api_key=settings.api_key,
                max_parallel_stream_requests=settings.grpc_max_parallel_stream_requests,
            )
        except (OSError, RuntimeError) as exc:
            raise StartupError(f"--grpc-port {settings.grpc_port}: {exc}") from None

    async def stop(self, grace: float | None = 30.0) -> None:
        """Refuse new calls at once; calls in flight get `grace` seconds to finish."""
        if self._stopped:
            return
        self._stopped = True
        await self.health.stop()
        await self.server.stop(grace)
