"""`authorization: Bearer <key>` on the five TEI services when --api-key is set."""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

#: The message TEI answers a missing or wrong key with.
DENIED = "No valid auth token"


async def _deny(request: Any, context: grpc.aio.ServicerContext) -> Any:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)


async def _deny_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, DENIED)
    yield  # makes this an async generator, as grpc.aio wants for streamed responses


def _denying(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` (so the call is read the same way) that refuses."""
    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(_deny_stream, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(_deny, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(_deny_stream, **kw)
    return grpc.unary_unary_rpc_method_handler(_deny, **kw)


class ApiKeyInterceptor(grpc.aio.ServerInterceptor):
    """Refuses calls to `protected` services without the key; health and reflection stay open."""

    def __init__(self, api_key: str, protected: tuple[str, ...]) -> None:
        self.expected = f"Bearer {api_key}".encode()
        self.prefixes = tuple(f"/{name}/" for name in protected)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(self.prefixes):
            return handler
        given = b""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                given = value.encode() if isinstance(value, str) else value
                break
        if hmac.compare_digest(given, self.expected):
            return handler
        return _denying(handler)
