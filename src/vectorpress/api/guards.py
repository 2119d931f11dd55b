"""Checks that run before a body is parsed: size limit, content type, API key."""

from __future__ import annotations

import hmac

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vectorpress.api.errors import error_body
from vectorpress.api.openapi import DOCS, DOCS_ASSETS, DOCS_OAUTH2_REDIRECT
from vectorpress.api.protocol import EXCHANGE

#: Routes whose GET is open without a key, as in TEI.
PUBLIC_PATHS = frozenset(
    {"/health", "/", "/ping", "/metrics", DOCS, DOCS_OAUTH2_REDIRECT, "/api-doc/openapi.json"}
)
#: The documentation page's own files.
PUBLIC_PREFIX = DOCS_ASSETS + "/"


TOO_LARGE = "Failed to buffer the request body: length limit exceeded"


class _TooLarge(HTTPException):
    """Raised from `receive`; FastAPI re-raises HTTPExceptions met while reading the body."""

    def __init__(self) -> None:
        super().__init__(413, TOO_LARGE)


class GuardMiddleware:
    """Pure ASGI middleware: refuses early with JSON errors, never buffers more than the limit.

    401 when a protected route lacks the key (compared in constant time), 415 when a POST body
    is not JSON, 413 when the body is over the payload limit.
    """

    def __init__(self, app: ASGIApp, payload_limit: int, api_key: str | None) -> None:
        self.app = app
        self.payload_limit = payload_limit
        self.api_key = api_key.encode() if api_key else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        headers = dict(scope["headers"])
        method: str = scope["method"]
        # Only reads are public: POST / is the model's own route and needs the key.
        public = method == "OPTIONS" or (
            method in ("GET", "HEAD") and (path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIX))
        )
        if self.api_key is not None and not public:
            given = headers.get(b"authorization", b"")
            expected = b"Bearer " + self.api_key
            if not hmac.compare_digest(given, expected):
                await _reply(send, path, 401, "Unauthorized", "Unauthorized")
                return
        if method == "POST":
            ctype = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if ctype != b"application/json" and not ctype.endswith(b"+json"):
                await _reply(
                    send,
                    path,
                    415,
                    "Expected request with `Content-Type: application/json`",
                    "Validation",
                )
                return
            length = headers.get(b"content-length")
            if length is not None and length.isdigit() and int(length) > self.payload_limit:
                await _reply(send, path, 413, TOO_LARGE, "Validation")
                return
            # Under this server's own protocol the parser ends a body at its stated length:
            # with one, there is nothing more to count.
            if length is None or EXCHANGE not in scope:
                receive = self._limited(receive)
        try:
            await self.app(scope, receive, send)
        except _TooLarge:
            await _reply(send, path, 413, TOO_LARGE, "Validation")

    def _limited(self, receive: Receive) -> Receive:
        seen = 0

        async def wrapped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.payload_limit:
                    raise _TooLarge()
            return message

        return wrapped


async def _reply(send: Send, path: str, status: int, message: str, error_type: str) -> None:
    body = error_body(path, message, error_type, status)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
