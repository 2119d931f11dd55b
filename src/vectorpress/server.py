"""Start-up: resolve and load the model, build the pipeline, warm up, then open the socket."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any

import torch
import uvicorn

from vectorpress.api.state import AppState
from vectorpress.backends.base import Backend
from vectorpress.backends.select import select_backend
from vectorpress.backends.torch.passes import CPU_PASS_TOKENS
from vectorpress.core.admission import Admission
from vectorpress.core.infer import Infer
from vectorpress.core.metrics import Metrics
from vectorpress.core.queue import BatchingQueue, LanePolicy
from vectorpress.core.scheduler import Scheduler
from vectorpress.core.tokenization import TokenizerPool
from vectorpress.core.worker import BackendWorker, limit_malloc_arenas
from vectorpress.hub import resolve_model
from vectorpress.model_spec import ModelSpec, load_model_spec
from vectorpress.observability.tracing import Tracing
from vectorpress.settings import ModelSettings, ServerSettings, Settings
from vectorpress.types import Batch, Encoding, OutputKind

log = logging.getLogger(__name__)


@dataclass
class Served:
    """One loaded model with its running pipeline."""

    settings: Settings
    spec: ModelSpec
    backend: Backend
    infer: Infer
    state: AppState
    tracing: Tracing | None = None

    def close(self) -> None:
        self.infer.worker.stop()
        self.infer.tokenizers.close()
        if self.tracing is not None:
            self.tracing.shutdown()


def build_pipeline(
    server: ServerSettings,
    settings: ModelSettings,
    spec: ModelSpec,
    backend: Backend,
    metrics: Metrics | None = None,
    scheduler: Scheduler | None = None,
    server_admission: Admission | None = None,
) -> Infer:
    """Queue, worker, tokenizer pool and Infer around a loaded backend, its worker added to
    `scheduler` (the one whose device thread loaded the backend; every model of a process
    shares it, and `server_admission`, the server-wide permits, when given)."""
    metrics = metrics or Metrics(spec.max_input_length, settings.model_name)
    metrics.set_info(backend=backend.name, dtype=backend.dtype, device=backend.device)
    max_batch_requests = backend.max_batch_size or settings.max_batch_requests
    queue = BatchingQueue(
        settings.max_batch_tokens,
        max_batch_requests,
        backend.is_padded,
        on_dropped=lambda n: metrics.inc("vectorpress_dropped_inputs", n),
    )

    def on_batch(batch: Batch, elapsed: float, ok: bool) -> None:
        metrics.record_batch(batch, elapsed, backend.is_padded, ok)

    run = backend.embed if spec.kind == "embedding" else backend.predict
    worker = BackendWorker(
        queue,
        run,
        on_batch,
        scheduler,
        pass_tokens=bulk_pass_tokens(settings, backend),
        weight=settings.scheduler_weight,
    )
    tokenizers = TokenizerPool.from_folder(
        spec.path,
        max_input_length=spec.max_input_length,
        position_offset=spec.position_offset,
        vocab_size=spec.vocab_size,
        prompts=spec.prompts,
        default_prompt=spec.default_prompt,
        workers=settings.tokenization_workers,
    )
    worker.start()
    return Infer(
        spec,
        tokenizers,
        queue,
        worker,
        max_concurrent_requests=server.max_concurrent_requests,
        max_client_batch_size=settings.max_client_batch_size,
        auto_truncate=settings.auto_truncate,
        metrics=metrics,
        lanes=LanePolicy(server.interactive_max_inputs, server.interactive_max_tokens),
        server_admission=server_admission,
    )


def bulk_pass_tokens(settings: ModelSettings, backend: Backend) -> int:
    """The most tokens of one bulk unit. On the CPU the torch backend runs a batch as passes
    of CPU_PASS_TOKENS anyway, so units of that size cost no throughput; a GPU keeps whole
    batches (its preemption points come between layers)."""
    if settings.bulk_pass_tokens is not None:
        return min(settings.bulk_pass_tokens, settings.max_batch_tokens)
    if backend.device == "cpu":
        return min(CPU_PASS_TOKENS, settings.max_batch_tokens)
    return settings.max_batch_tokens


def make_scheduler(server: ServerSettings) -> Scheduler:
    """The process's one device thread; backends are loaded and warmed up on it."""
    return Scheduler(preempt=server.preemption)


def make_server_admission(server: ServerSettings) -> Admission | None:
    """The server-wide permits, when --max-total-concurrent-requests caps them."""
    cap = server.max_total_concurrent_requests
    return Admission(cap) if cap is not None else None


def warm_up(backend: Backend, spec: ModelSpec, settings: ModelSettings) -> None:
    """A 1-token forward (health), then one input of the max length, before the socket opens.

    On a GPU the whole token budget runs once, so that a budget too large for the device's
    memory fails at start-up rather than on the first busy minute.
    """
    run = backend.embed if spec.kind == "embedding" else backend.predict
    offset = spec.position_offset

    def enc(n: int) -> Encoding:
        return Encoding(ids=[0] * n, type_ids=[0] * n, position_offset=offset)

    run(Batch.from_encodings([enc(1)]))
    if backend.device.startswith("cuda"):
        n = max(1, settings.max_batch_tokens // spec.max_input_length)
        if settings.max_batch_requests:
            n = min(n, settings.max_batch_requests)
        run(Batch.from_encodings([enc(spec.max_input_length)] * n))
    else:
        run(Batch.from_encodings([enc(spec.max_input_length)], [OutputKind.POOLED]))


BackendFactory = Callable[[ModelSpec, ModelSettings], Backend]


def load(config: Settings, make_backend: BackendFactory = select_backend) -> Served:
    server, settings = config.server, config.model
    limit_malloc_arenas()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    folder = resolve_model(
        settings.model_id,
        settings.revision,
        settings.hf_token,
        settings.huggingface_hub_cache,
        want_onnx=settings.backend == "onnx",
    )
    spec = load_model_spec(folder, settings)
    scheduler = make_scheduler(server)
    try:
        backend = scheduler.call(lambda: make_backend(spec, settings))
        scheduler.call(lambda: warm_up(backend, spec, settings))
    except BaseException:
        scheduler.stop()
        raise
    infer = build_pipeline(
        server,
        settings,
        spec,
        backend,
        scheduler=scheduler,
        server_admission=make_server_admission(server),
    )
    tracing = Tracing.from_settings(server)
    if tracing is not None:
        infer.tracer = tracing.tracer
        log.info("tracing to %s as %s", tracing.endpoint, server.otlp_service_name)
    state = AppState(infer, settings, server, backend.name, backend.dtype, backend.device)
    # Fields rather than prose, so JSON logs carry them as values (text logs append them).
    startup = {
        "model": settings.model_id,
        "served_model_name": settings.model_name,
        "architecture": spec.architecture,
        "kind": spec.kind,
        "backend": backend.name,
        "dtype": backend.dtype,
        "device": backend.device,
        "max_input_length": spec.max_input_length,
        "max_batch_tokens": settings.max_batch_tokens,
        "max_batch_requests": infer.queue.max_batch_requests,
        "max_concurrent_requests": server.max_concurrent_requests,
        "max_client_batch_size": settings.max_client_batch_size,
    }
    log.info("model loaded and warmed up", extra=startup)
    return Served(config, spec, backend, infer, state, tracing)


def freeze_startup_objects() -> int:
    """Keep what start-up made out of the cyclic garbage collector's full passes.

    The imports (torch, transformers, FastAPI, pydantic) and the loaded model leave a few
    hundred thousand tracked objects, and a full collection walked them all, holding the GIL
    for 50-130 ms: the forward pass and every request stopped behind it whenever traffic had
    allocated enough to trigger one (after the benchmark's load, one short query of 71-144 ms
    in every 300).
    Frozen, they are not walked again; what requests allocate is collected as before. Returns
    how many were frozen.
    """
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM after its graceful shutdown, so the process dies by the
    signal; a drained, clean stop should exit 0 instead."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {
            sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    also_stop: Callable[[], Awaitable[None]] | None = None
    """Another listener (gRPC) to drain together with HTTP on shutdown."""

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.also_stop is None:
            await super().shutdown(sockets)
        else:
            await asyncio.gather(super().shutdown(sockets), self.also_stop())

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            frozen = freeze_startup_objects()
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            log.info(
                "Ready: listening on http://%s:%d", host, port, extra={"gc_frozen_objects": frozen}
            )


class _MetricsServer(uvicorn.Server):
    """The --prometheus-port listener; the main server owns the signals and stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


async def serve(served: Served) -> None:
    from vectorpress.api.app import create_app

    settings = served.settings.server
    app = create_app(served.state)
    config = uvicorn.Config(
        app,
        host=settings.hostname,
        port=settings.port,
        log_config=None,
        access_log=False,
        lifespan="off",
        timeout_graceful_shutdown=30,
    )
    server = _Server(config)
    metrics_server: _MetricsServer | None = None
    if settings.prometheus_port is not None:
        from vectorpress.api.metrics_route import bind_listener, metrics_app

        # Bound before gRPC starts: a taken port then stops start-up with nothing to undo.
        metrics_socket = bind_listener(settings.hostname, settings.prometheus_port)
        metrics_server = _MetricsServer(
            uvicorn.Config(
                metrics_app(served.infer.metrics),
                host=settings.hostname,
                port=settings.prometheus_port,
                log_config=None,
                access_log=False,
                lifespan="off",
            )
        )
    grpc_server = None
    if settings.grpc_port is not None:
        from vectorpress.api.grpc.server import GrpcServer

        grpc_server = await GrpcServer.from_settings(served.state)
        server.also_stop = grpc_server.stop
    try:
        if metrics_server is None:
            await server.serve()
        else:
            metrics_task = asyncio.ensure_future(metrics_server.serve(sockets=[metrics_socket]))
            try:
                await server.serve()
            finally:
                metrics_server.should_exit = True
                await metrics_task
            log.info("metrics listener on port %d closed", settings.prometheus_port)
    finally:
        if grpc_server is not None:
            await grpc_server.stop()  # no-op after a normal shutdown
        served.close()


def run(settings: Settings) -> None:
    served = load(settings)
    run_event_loop(serve(served))


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run the server's coroutine on uvloop where it is installed (Linux and macOS): its loop
    and uvicorn's httptools parser take about a millisecond off each request."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)
