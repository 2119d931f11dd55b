"""Spans reach a real OTLP/gRPC receiver with the caller's trace id and the right parents."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry import trace
from opentelemetry.sdk import trace as sdk_trace

from tests.helpers.server import LiveServer
from tests.observability.otlp import OtlpReceiver, ReceivedSpan
from vectorpress.observability.middleware import GrpcTracingInterceptor
from vectorpress.observability.tracing import Tracing
from vectorpress.settings import Settings

SERVER_KIND = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER


def traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def one(spans: list[ReceivedSpan], name: str, trace_id: str) -> ReceivedSpan:
    found = [s for s in spans if s.name == name and s.trace_id == trace_id]
    assert len(found) == 1, f"{name}: {[(s.name, s.trace_id) for s in spans]}"
    return found[0]


@pytest.fixture(scope="module")
def folder(tiny_bert_family: Callable[..., Path]) -> Path:
    return tiny_bert_family("bert", "embedding", "mean")


def test_http_request_spans_follow_the_callers_trace(folder: Path) -> None:
    header, caller_trace, caller_span = traceparent()
    other_header, other_trace, _ = traceparent()
    with OtlpReceiver() as receiver:
        settings = Settings.single(
            model_id=str(folder), otlp_endpoint=receiver.endpoint, otlp_service_name="vp-test"
        )
        with LiveServer(settings) as srv:
            response = httpx.post(
                f"{srv.url}/embed",
                json={"inputs": ["first text", "second text", "third"]},
                headers={"traceparent": header},
                timeout=60,
            )
            assert response.status_code == 200
            untraced = httpx.post(f"{srv.url}/embed", json={"inputs": "alone"}, timeout=60)
            assert untraced.status_code == 200
            missing = httpx.get(f"{srv.url}/no/such/path/42", headers={"traceparent": header})
            assert missing.status_code == 404
            prefixed = httpx.post(
                f"{srv.url}/models/any/embed",
                json={"inputs": "x"},
                headers={"traceparent": other_header},
                timeout=60,
            )
            assert prefixed.status_code == 200
        # Leaving the server shuts the tracer provider down, which exports what is buffered.
        spans = list(receiver.spans)

    request = one(spans, "POST /embed", caller_trace)
    assert request.parent_span_id == caller_span
    assert request.kind == SERVER_KIND and request.service_name == "vp-test"
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["http.route"] == "/embed"
    # Under a model's prefix, named by the route all the same; the path is the one asked for.
    prefixed_span = one(spans, "POST /embed", other_trace)
    assert prefixed_span.attributes["url.path"] == "/models/any/embed"
    unmatched = one(spans, "GET", caller_trace)  # not named after a path nobody serves
    assert unmatched.attributes["http.response.status_code"] == 404
    assert request.attributes["vectorpress.operation"] == "embed"
    assert request.attributes["vectorpress.inputs"] == 3
    for stage in ("tokenization", "queue", "inference"):
        child = one(spans, stage, caller_trace)
        assert child.parent_span_id == request.span_id, stage
    assert one(spans, "inference", caller_trace).attributes["vectorpress.tokens"] > 0

    # Without a traceparent the request starts a trace of its own, with its own children.
    roots = [
        s
        for s in spans
        if s.name == "POST /embed" and s.trace_id not in (caller_trace, other_trace)
    ]
    assert len(roots) == 1 and roots[0].parent_span_id == ""
    children = {s.name for s in spans if s.parent_span_id == roots[0].span_id}
    assert children == {"tokenization", "queue", "inference"}


def test_tei_grpc_call_spans_follow_the_metadata_traceparent(folder: Path) -> None:
    from vectorpress.api.grpc.stubs import pb, pb_grpc

    header, caller_trace, caller_span = traceparent()
    with OtlpReceiver() as receiver:
        settings = Settings.single(str(folder), otlp_endpoint=receiver.endpoint)
        with (
            LiveServer(settings, grpc=True) as srv,
            grpc.insecure_channel(srv.grpc_target) as channel,
        ):
            reply = pb_grpc.EmbedStub(channel).Embed(
                pb.EmbedRequest(inputs="a traced call"), metadata=(("traceparent", header),)
            )
            assert len(reply.embeddings) > 0
        spans = list(receiver.spans)
    call = one(spans, "tei.v1.Embed/Embed", caller_trace)
    assert call.parent_span_id == caller_span and call.kind == SERVER_KIND
    assert call.attributes["vectorpress.operation"] == "embed"
    children = {s.name for s in spans if s.parent_span_id == call.span_id}
    assert children == {"tokenization", "queue", "inference"}


def test_grpc_interceptor_on_any_service() -> None:
    header, caller_trace, caller_span = traceparent()
    with OtlpReceiver() as receiver:
        tracing = Tracing(receiver.endpoint, "vp-grpc")

        async def call() -> None:
            server = grpc.aio.server(interceptors=[GrpcTracingInterceptor(tracing.tracer)])
            health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                    stub = health_pb2_grpc.HealthStub(channel)
                    await stub.Check(
                        health_pb2.HealthCheckRequest(), metadata=(("traceparent", header),)
                    )
            finally:
                await server.stop(5)

        asyncio.run(call())
        tracing.shutdown()
        spans = list(receiver.spans)
    span = one(spans, "grpc.health.v1.Health/Check", caller_trace)
    assert span.parent_span_id == caller_span and span.kind == SERVER_KIND
    assert span.service_name == "vp-grpc"


def test_no_span_object_is_created_without_an_endpoint(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    created: list[Any] = []
    for cls in (sdk_trace.Span, trace.NonRecordingSpan):
        original = cls.__init__

        def counting(self: Any, *args: Any, __original: Any = original, **kwargs: Any) -> None:
            created.append(self)
            __original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counting)

    with LiveServer(Settings.single(str(folder))) as srv:
        assert srv.infer.tracer is None
        header, _, _ = traceparent()
        response = httpx.post(
            f"{srv.url}/embed", json={"inputs": ["a", "b"]}, headers={"traceparent": header}
        )
        assert response.status_code == 200
        assert httpx.get(f"{srv.url}/health").status_code == 200
    assert created == []


def test_the_instrumented_counter_sees_spans_when_tracing_is_on(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The counting above can fail: with an endpoint the same requests do create spans."""
    created: list[Any] = []
    original = sdk_trace.Span.__init__

    def counting(self: Any, *args: Any, **kwargs: Any) -> None:
        created.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(sdk_trace.Span, "__init__", counting)
    with OtlpReceiver() as receiver:
        settings = Settings.single(str(folder), otlp_endpoint=receiver.endpoint)
        with LiveServer(settings) as srv:
            assert httpx.post(f"{srv.url}/embed", json={"inputs": "a"}).status_code == 200
    assert len(created) >= 4


@pytest.fixture(autouse=True)
def _no_global_provider() -> Iterator[None]:
    # The server keeps its own provider; the global one must stay the API's default.
    before = trace.get_tracer_provider()
    yield
    assert trace.get_tracer_provider() is before
