"""Messages that are not valid protobuf fail with INVALID_ARGUMENT, in their own stream slot.

grpc.aio would answer a unary call with UNKNOWN ("Unexpected DecodeError") and fail a stream
from inside its reader. Here the handlers get raw bytes and decode them themselves, so a bad
message becomes a validation error like any other bad input.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

from vectorpress.errors import ValidationError

Decode = Callable[[bytes], Any]


def _decoder(deserialize: Decode) -> Callable[[bytes], Any]:
    owner = getattr(deserialize, "__self__", None)
    descriptor = getattr(owner, "DESCRIPTOR", None)
    name = getattr(descriptor, "full_name", "the request type")

    def decode(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except DecodeError as exc:
            raise ValidationError(
                f"Input validation error: the message is not a valid {name}: {exc}"
            ) from None

    return decode


async def _decoded(raw: AsyncIterable[bytes], decode: Callable[[bytes], Any]) -> AsyncIterator[Any]:
    async for message in raw:
        yield decode(message)


def _wrap(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    decode = _decoder(handler.request_deserializer)
    serialize = handler.response_serializer
    if handler.request_streaming and handler.response_streaming:
        stream_stream = handler.stream_stream

        async def both(raw: AsyncIterable[bytes], context: Any) -> AsyncIterator[Any]:
            async for response in stream_stream(_decoded(raw, decode), context):
                yield response

        return grpc.stream_stream_rpc_method_handler(both, response_serializer=serialize)
    if handler.request_streaming:
        stream_unary: Callable[..., Awaitable[Any]] = handler.stream_unary

        async def client_stream(raw: AsyncIterable[bytes], context: Any) -> Any:
            return await stream_unary(_decoded(raw, decode), context)

        return grpc.stream_unary_rpc_method_handler(client_stream, response_serializer=serialize)
    if handler.response_streaming:
        return handler  # tei.v1 has no server-streaming RPC with a unary request
    unary_unary: Callable[..., Awaitable[Any]] = handler.unary_unary

    async def unary(raw: bytes, context: Any) -> Any:
        try:
            request = decode(raw)
        except ValidationError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
        return await unary_unary(request, context)

    return grpc.unary_unary_rpc_method_handler(unary, response_serializer=serialize)


class DecodeInterceptor(grpc.aio.ServerInterceptor):
    """Hands raw bytes to the `services` handlers and decodes them in the handler."""

    def __init__(self, services: tuple[str, ...]) -> None:
        self.prefixes = tuple(f"/{name}/" for name in services)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if (
            handler is None
            or handler.request_deserializer is None
            or not handler_call_details.method.startswith(self.prefixes)
        ):
            return handler
        return _wrap(handler)
