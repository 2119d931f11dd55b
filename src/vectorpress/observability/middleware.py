"""Where a request's span starts: an ASGI middleware for HTTP, an interceptor for grpc.aio.

Both read the caller's W3C `traceparent` (HTTP header or gRPC metadata) and open a SERVER span
that the pipeline's stage spans hang under. Installed only when tracing is on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vectorpress.observability.tracing import extract

# -- HTTP ---------------------------------------------------------------------------------------


class TracingMiddleware:
    """One SERVER span per HTTP request, child of the caller's `traceparent` when present."""

    def __init__(self, app: ASGIApp, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        carrier = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope["headers"]
            if k in (b"traceparent", b"tracestate")
        }
        method, path = scope["method"], scope["path"]
        # Named after the matched route once routing is done; an unmatched path stays out of
        # the name, so scanners probing random paths cannot flood a backend with span names.
        with self.tracer.start_as_current_span(
            method,
            context=extract(carrier),
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
        ) as span:
            status = 500

            async def traced_send(message: Message) -> None:
                nonlocal status
                if message["type"] == "http.response.start":
                    status = message["status"]
                await send(message)

            try:
                await self.app(scope, receive, traced_send)
            finally:
                route = getattr(scope.get("route"), "path", None)
                if isinstance(route, str):
                    span.update_name(f"{method} {route}")
                    span.set_attribute("http.route", route)
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR))


# -- gRPC ---------------------------------------------------------------------------------------


class GrpcTracingInterceptor(grpc.aio.ServerInterceptor):
    """grpc.aio server interceptor: one SERVER span per call, parented by `traceparent` metadata."""

    def __init__(self, tracer: Tracer) -> None:
        self.tracer = tracer

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        handler = await continuation(details)
        if handler is None:
            return None
        carrier = {
            k: v
            for k, v in (details.invocation_metadata or ())
            if k in ("traceparent", "tracestate") and isinstance(v, str)
        }
        parent = extract(carrier)
        name = details.method.lstrip("/")
        tracer = self.tracer

        def span() -> Any:
            return tracer.start_as_current_span(
                name, context=parent, kind=SpanKind.SERVER, attributes={"rpc.system": "grpc"}
            )

        def unary_response(behavior: Any) -> Any:
            async def wrapped(request: Any, ctx: Any) -> Any:
                with span():
                    return await behavior(request, ctx)

            return wrapped

        def stream_response(behavior: Any) -> Any:
            async def wrapped(request: Any, ctx: Any) -> Any:
                with span():
                    async for item in behavior(request, ctx):
                        yield item

            return wrapped

        kinds = (
            ("unary_unary", unary_response, grpc.unary_unary_rpc_method_handler),
            ("unary_stream", stream_response, grpc.unary_stream_rpc_method_handler),
            ("stream_unary", unary_response, grpc.stream_unary_rpc_method_handler),
            ("stream_stream", stream_response, grpc.stream_stream_rpc_method_handler),
        )
        for attr, wrap, make in kinds:
            behavior = getattr(handler, attr)
            if behavior is not None:
                return make(
                    wrap(behavior),
                    request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer,
                )
        return handler
