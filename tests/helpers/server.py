"""A real vectorpress HTTP server on a real loopback socket, run in a thread of the test process."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from types import TracebackType
from typing import TYPE_CHECKING

import uvicorn

from vectorpress.api.app import create_app
from vectorpress.api.protocol import GatheringHttpTools
from vectorpress.server import BackendFactory, Served, load, run_event_loop
from vectorpress.settings import Settings

if TYPE_CHECKING:
    from vectorpress.api.grpc.server import GrpcServer

#: TEI's timing headers, as its HTTP answers and its gRPC initial metadata name them (written
#: out from TEI's contract, not read from the code under test).
TIMING_HEADERS = (
    "x-compute-type",
    "x-compute-time",
    "x-compute-characters",
    "x-compute-tokens",
    "x-total-time",
    "x-tokenization-time",
    "x-queue-time",
    "x-inference-time",
)


class LiveServer:
    """`with LiveServer(settings) as srv:` serves on 127.0.0.1 on a free port at `srv.url`.

    With `grpc=True` it also serves TEI's gRPC API on the same event loop, at `srv.grpc_target`.
    """

    def __init__(
        self,
        settings: Settings,
        make_backend: BackendFactory | None = None,
        *,
        grpc: bool = False,
    ) -> None:
        self.settings = replace(
            settings, server=replace(settings.server, hostname="127.0.0.1", port=0)
        )
        self.make_backend = make_backend
        self.grpc = grpc
        self.grpc_server: GrpcServer | None = None
        self.grpc_target = ""
        self.served: Served | None = None
        self.url = ""
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LiveServer:
        kwargs = {"make_backend": self.make_backend} if self.make_backend else {}
        self.served = load(self.settings, **kwargs)
        app = create_app(self.served.state)
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=0,
            http=GatheringHttpTools,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=10,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=lambda: run_event_loop(self._serve()), daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        if self.grpc_server is not None:
            self.grpc_target = f"127.0.0.1:{self.grpc_server.port}"
        return self

    async def _serve(self) -> None:
        assert self._server is not None and self.served is not None
        if self.grpc:
            from vectorpress.api.grpc.server import GrpcServer

            self.grpc_server = await GrpcServer.start(
                self.served.state,
                "127.0.0.1",
                0,
                api_key=self.settings.server.api_key,
                max_parallel_stream_requests=self.settings.server.grpc_max_parallel_stream_requests,
            )
        try:
            await self._server.serve()
        finally:
            if self.grpc_server is not None:
                await self.grpc_server.stop(10)

    @property
    def infer(self):  # type: ignore[no-untyped-def]
        assert self.served is not None
        return self.served.infer

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None and self._thread is not None
        self._server.should_exit = True
        self._thread.join(30)
        if self.served is not None:
            self.served.close()
