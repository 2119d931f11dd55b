"""OpenTelemetry traces: an OTLP/gRPC exporter, W3C trace context in, one span per request.

Tracing exists only when `--otlp-endpoint` is given. Without it nothing here is built, the
HTTP middleware and gRPC interceptor (middleware.py) are not installed and `Infer.tracer` is
None, so a request creates no span object at all (not even the API's no-op spans). The SDK and
exporter are imported only then, too.

A request's span is the parent of three stage spans: `tokenization` (timed live), `queue` and
`inference`. The last two happen on the backend thread inside a shared batch, so they are
recorded afterwards from the entries' own timestamps: `queue` runs from the first input's
enqueue to the last input's batch start, `inference` from the first batch start to the last
batch end.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from vectorpress import __version__
from vectorpress.settings import ServerSettings
from vectorpress.types import Entry

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

_PROPAGATOR = TraceContextTextMapPropagator()

# Entries carry perf_counter stamps; spans need wall-clock nanoseconds. Fixed once: a later
# step of the wall clock (NTP) shifts the recorded spans against the live ones by that step.
_PERF_TO_EPOCH_NS = time.time_ns() - time.perf_counter_ns()


def _epoch_ns(perf: float) -> int:
    return int(perf * 1e9) + _PERF_TO_EPOCH_NS


class Tracing:
    """The tracer provider of one server process, exporting to one OTLP/gRPC collector."""

    def __init__(
        self, endpoint: str, service_name: str, exporter: SpanExporter | None = None
    ) -> None:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ALWAYS_ON

        if "://" not in endpoint:
            endpoint = f"http://{endpoint}"  # TEI's examples give a scheme; be lenient
        self.endpoint = endpoint
        resource = Resource.create({SERVICE_NAME: service_name, SERVICE_VERSION: __version__})
        # A provider of our own rather than the global one: nothing else in the process is
        # affected, and tests can run several servers with different collectors.
        self.provider = TracerProvider(resource=resource, sampler=ALWAYS_ON)
        self.provider.add_span_processor(
            BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=endpoint))
        )
        self.tracer: Tracer = self.provider.get_tracer("vectorpress", __version__)

    @classmethod
    def from_settings(cls, settings: ServerSettings) -> Tracing | None:
        if not settings.otlp_endpoint:
            return None
        return cls(settings.otlp_endpoint, settings.otlp_service_name)

    def shutdown(self) -> None:
        """Export what is buffered, then stop."""
        self.provider.shutdown()


def extract(carrier: Mapping[str, str]) -> Context:
    """The caller's context from W3C `traceparent` / `tracestate` (an empty one without)."""
    return _PROPAGATOR.extract(carrier)


# -- spans the pipeline records ------------------------------------------------------------------


@contextlib.contextmanager
def request_span(tracer: Tracer, operation: str, inputs: int) -> Iterator[None]:
    """Annotate the current request span, or start one when the caller has none (no dialect
    middleware around this call)."""
    current = trace.get_current_span()
    attributes: dict[str, str | int] = {
        "vectorpress.operation": operation,
        "vectorpress.inputs": inputs,
    }
    if current.is_recording():
        current.set_attributes(attributes)
        yield
        return
    with tracer.start_as_current_span(operation, kind=SpanKind.SERVER, attributes=attributes):
        yield


@contextlib.contextmanager
def stage(tracer: Tracer, name: str, **attributes: Any) -> Iterator[None]:
    """A live child span of the current span."""
    with tracer.start_as_current_span(name, attributes=attributes):
        yield


def record_batches(tracer: Tracer, entries: Sequence[Entry]) -> None:
    """`queue` and `inference` child spans of the current span, from the entries' stamps."""
    if not entries:
        return
    queued = min(e.queued_at for e in entries)
    starts = [e.queued_at + e.queue_time for e in entries]
    ends = [s + e.inference_time for s, e in zip(starts, entries, strict=True)]
    batches = len(set(starts))
    tokens = sum(len(e.encoding) for e in entries)
    span = tracer.start_span("queue", start_time=_epoch_ns(queued))
    span.set_attribute("vectorpress.inputs", len(entries))
    span.end(end_time=_epoch_ns(max(starts)))
    span = tracer.start_span("inference", start_time=_epoch_ns(min(starts)))
    span.set_attributes({"vectorpress.batches": batches, "vectorpress.tokens": tokens})
    span.end(end_time=_epoch_ns(max(ends)))


def current_ids() -> tuple[str, str, str] | None:
    """(trace id, span id, span name) of the current recording span, for log lines."""
    span = trace.get_current_span()
    if not span.is_recording():
        return None
    ctx = span.get_span_context()
    return (
        trace.format_trace_id(ctx.trace_id),
        trace.format_span_id(ctx.span_id),
        getattr(span, "name", ""),
    )


__all__ = [
    "Tracing",
    "current_ids",
    "extract",
    "record_batches",
    "request_span",
    "stage",
]
