"""Start-up: resolve and load each model, build its pipeline, warm up, then open the socket."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Generator
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import torch
import uvicorn

from vectorpress.api.state import AppState, ModelState
from vectorpress.backends.base import Backend
from vectorpress.backends.select import select_backend
from vectorpress.backends.torch.passes import CPU_PASS_TOKENS
from vectorpress.core.admission import Admission
from vectorpress.core.calibration import Calibration
from vectorpress.core.heap import limit_malloc_arenas, malloc_arenas
from vectorpress.core.infer import Infer
from vectorpress.core.metrics import Metrics, Registry
from vectorpress.core.models import Models
from vectorpress.core.queue import BatchingQueue, LanePolicy
from vectorpress.core.scheduler import Scheduler
from vectorpress.core.tokenization import TokenizerPool
from vectorpress.core.worker import BackendWorker
from vectorpress.cpus import available_cpus
from vectorpress.errors import StartupError
from vectorpress.model_spec import ModelSpec, resolve_model_spec
from vectorpress.observability.tracing import Tracing
from vectorpress.settings import ModelSettings, ServerSettings, Settings
from vectorpress.types import Batch, Encoding

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """One loaded model with its running pipeline."""

    settings: ModelSettings
    spec: ModelSpec
    backend: Backend
    infer: Infer
    state: ModelState

    def close(self) -> None:
        self.infer.worker.stop()
        self.infer.tokenizers.close()


@dataclass
class Served:
    """Every served model, running, and the API state over them; the first is the default."""

    settings: Settings
    models: list[LoadedModel]
    state: AppState
    tracing: Tracing | None = None

    @property
    def default(self) -> LoadedModel:
        return self.models[0]

    @property
    def spec(self) -> ModelSpec:
        return self.default.spec

    @property
    def backend(self) -> Backend:
        return self.default.backend

    @property
    def infer(self) -> Infer:
        return self.default.infer

    def close(self) -> None:
        for model in self.models:
            model.close()
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
        concurrent=backend.concurrent_passes,
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
        windowed=settings.windowed_inputs,
        window_overlap=settings.window_overlap,
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
    """The process's device thread (backends are loaded and warmed up on it) and its
    runners."""
    return Scheduler(preempt=server.preemption, runners=device_runners(server))


def device_runners(server: ServerSettings) -> int:
    """`--device-runners`, its 0 resolved: two where the CPU has two intra-op threads or more
    (measured on 2-core machines only; a larger CPU gets two units of half its threads); never
    more runners than threads, which would leave each runner's unit less than one."""
    threads = max(1, torch.get_num_threads())
    if server.device_runners:
        return min(server.device_runners, threads)
    return 2 if threads >= 2 else 1


def make_server_admission(server: ServerSettings) -> Admission | None:
    """The server-wide permits, when --max-total-concurrent-requests caps them."""
    cap = server.max_total_concurrent_requests
    return Admission(cap) if cap is not None else None


def calibrate(backend: Backend, spec: ModelSpec) -> Calibration | None:
    """Pooled vectors of the packaged calibration texts, for int8/uint8 embedding outputs
    (api/encodings.py); dense embedding models only."""
    if spec.kind != "embedding" or spec.is_splade or "dense" not in spec.outputs:
        return None
    from vectorpress.backends.common.calibration import calibration_batch

    pooled = backend.embed(calibration_batch(spec)).pooled
    return None if pooled is None else Calibration(np.asarray(pooled, dtype=np.float32))


def warm_up(backend: Backend, spec: ModelSpec, settings: ModelSettings) -> None:
    """A 1-token forward (health), then one input of the max length, before the socket opens.

    On a GPU the whole token budget runs once, so that a budget too large for the device's
    memory fails at start-up rather than on the first busy minute.
    """
    run = backend.embed if spec.kind == "embedding" else backend.predict
    offset = spec.position_offset

    def enc(n: int) -> Encoding:
        return Encoding(ids=[0] * n, type_ids=[0] * n, position_offset=offset)

    run(Batch.from_encodings([enc(1)], [spec.probe_kind]))
    if backend.device.startswith("cuda"):
        n = max(1, settings.max_batch_tokens // spec.max_input_length)
        if settings.max_batch_requests:
            n = min(n, settings.max_batch_requests)
        run(Batch.from_encodings([enc(spec.max_input_length)] * n, [spec.probe_kind] * n))
    else:
        run(Batch.from_encodings([enc(spec.max_input_length)], [spec.probe_kind]))


BackendFactory = Callable[[ModelSpec, ModelSettings], Backend]


def load(
    config: Settings,
    make_backend: BackendFactory = select_backend,
    *,
    threads: int | None = None,
) -> Served:
    """Load, warm up and start every model, in order; if one fails, those already started are
    stopped and start-up fails with one line naming the model. `threads`: torch's intra-op
    threads (default: every core); an in-process engine that shares the machine sets fewer."""
    limit_malloc_arenas(malloc_arenas(sum(m.tokenization_workers for m in config.models)))
    torch.set_num_threads(threads or available_cpus())
    server = config.server
    registry = Registry()
    tracing = Tracing.from_settings(server)
    if tracing is not None:
        log.info("tracing to %s as %s", tracing.endpoint, server.otlp_service_name)
    # One device thread for every model: each loads, warms up and runs on it.
    scheduler = make_scheduler(server)
    admission = make_server_admission(server)
    loaded: list[LoadedModel] = []
    try:
        for settings in config.models:
            loaded.append(
                _load_one(config, settings, make_backend, registry, tracing, scheduler, admission)
            )
    except BaseException:
        for model in loaded:
            model.close()
        scheduler.stop()
        if tracing is not None:
            tracing.shutdown()
        raise
    state = AppState(
        server,
        Models([m.state for m in loaded]),
        registry,
        tracing.tracer if tracing is not None else None,
    )
    return Served(config, loaded, state, tracing)


def _load_one(
    config: Settings,
    settings: ModelSettings,
    make_backend: BackendFactory,
    registry: Registry,
    tracing: Tracing | None,
    scheduler: Scheduler,
    admission: Admission | None,
) -> LoadedModel:
    server = config.server
    name = settings.model_name
    try:
        spec = resolve_model_spec(settings)
        backend = scheduler.call(lambda: make_backend(spec, settings))
        scheduler.call(lambda: warm_up(backend, spec, settings))
        calibration = scheduler.call(lambda: calibrate(backend, spec))
    except StartupError as exc:
        if len(config.models) == 1:
            raise
        raise StartupError(f"model {name}: {exc}") from None
    except Exception as exc:
        # A checkpoint that does not load (bad weights, an unknown layer): one line for the
        # operator, the traceback in the log.
        log.exception("model %s failed to load", name)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise StartupError(f"model {name} ({settings.model_id}) failed to load: {first}") from None
    metrics = Metrics(spec.max_input_length, name, registry)
    infer = build_pipeline(
        server, settings, spec, backend, metrics, scheduler=scheduler, server_admission=admission
    )
    infer.calibration = calibration
    if tracing is not None:
        infer.tracer = tracing.tracer
    state = ModelState(infer, settings, server, backend.name, backend.dtype, backend.device)
    # Fields rather than prose, so JSON logs carry them as values (text logs append them).
    startup = {
        "model": settings.model_id,
        "served_model_name": name,
        "aliases": list(settings.aliases),
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
        "threads": torch.get_num_threads(),
        "tokenization_workers": settings.tokenization_workers,
    }
    log.info("model loaded and warmed up", extra=startup)
    return LoadedModel(settings, spec, backend, infer, state)


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
    from vectorpress.api.protocol import GatheringHttpTools

    settings = served.settings.server
    app = create_app(served.state)
    config = uvicorn.Config(
        app,
        host=settings.hostname,
        port=settings.port,
        http=GatheringHttpTools,
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
                metrics_app(served.state.registry),
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


def exit_after_stop(code: int = 0) -> NoReturn:
    """End the process at once after a clean stop (every request answered, every model
    stopped): nothing is left to finalize, and the interpreter's teardown beside torch's native
    threads sometimes aborted it (`terminate called without an active exception`, exit -6 after
    a SIGTERM drain had answered everything: 2 of 5 fresh-clone CI runs on a Zen 4)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


#: How long a thread holding the interpreter lock keeps it from one that waits (Python's default
#: is 5 ms). The device thread takes the lock back after every operator of an eager forward pass,
#: so beside a busy event loop or answer builder each operator could wait that long: a one-text
#: /embed took 69 ms next to a busy Python thread at 5 ms, 27 ms at 0.5 ms (7 ms alone).
SWITCH_INTERVAL_S = 0.0005


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run the server's coroutine on uvloop where it is installed (Linux and macOS): its loop
    and uvicorn's httptools parser take about a millisecond off each request."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)
