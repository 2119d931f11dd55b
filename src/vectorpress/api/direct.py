"""The inference routes answered straight from ASGI, before FastAPI's own request handling.

FastAPI spent about half a millisecond of a short query's two outside the model on matching
nested routers, solving dependencies, validating a parsed dict and building a Response. Here a
body that pydantic's JSON parser validates goes straight to the route's handler (the same
`run_*` functions FastAPI's routes call) and its JSON is sent as two ASGI messages. Everything
else, a body that does not validate included, goes on to FastAPI: error answers and the OpenAPI
schema stay FastAPI's own. The answer leaves through the request's `Exchange` where the server's
own protocol gives one (one write, no ASGI messages through the layers outside).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pydantic
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vectorpress.api import answers, bodies
from vectorpress.api.errors import (
    error_response,
    internal_error_response,
    vectorpress_error_response,
)
from vectorpress.api.headers import timing_headers
from vectorpress.api.protocol import EXCHANGE, Exchange
from vectorpress.api.routing import resolve
from vectorpress.api.state import AppState, ModelState
from vectorpress.core.infer import Result
from vectorpress.errors import VectorpressError

log = logging.getLogger(__name__)

Handler = Callable[[ModelState, Any, str | None], Awaitable[tuple[Any, Result[Any]]]]
Body = type[pydantic.BaseModel]
Choose = Callable[[ModelState], tuple[Body, Handler]]


class _Named(pydantic.BaseModel):
    """Just the `model` of a body whose type depends on the model it names."""

    model_config = pydantic.ConfigDict(extra="ignore")
    model: pydantic.StrictStr | None = None


@dataclass(frozen=True)
class DirectRoute:
    path: str
    """Also what the tracing middleware names the request's span by, as FastAPI's routes."""
    body: Body | None
    """None when the body's type depends on the model (POST /): `choose` picks it."""
    handler: Handler | None = None
    choose: Choose | None = None

    @classmethod
    def per_model(cls, path: str, choose: Choose) -> DirectRoute:
        return cls(path, None, None, choose)


class DirectRoutes:
    """Pure ASGI: POSTs to the table's paths skip FastAPI when their body validates.

    Sits inside the guard and disconnect middlewares, so the key, size and content-type checks
    and the cancellation of abandoned requests apply as on every other route.
    """

    def __init__(self, app: ASGIApp, state: AppState, routes: Iterable[DirectRoute]) -> None:
        self.app = app
        self.state = state
        self.routes = {route.path: route for route in routes}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # gone before its body arrived: nobody to answer
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        raw = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        refusal = bodies.refused(raw)
        if refusal is not None:
            answer = error_response(route.path, bodies.PREFIX + refusal, "Validation", 400)
            await answer(scope, receive, send)
            return
        path = route.path
        try:
            if route.choose is None:
                assert route.body is not None and route.handler is not None
                body = route.body.model_validate_json(raw)
                model = resolve(self.state, scope, getattr(body, "model", None))
                handler = route.handler
            else:
                name = None
                if len(self.state.models) > 1:
                    name = _Named.model_validate_json(raw).model
                model = resolve(self.state, scope, name)
                body_type, handler = route.choose(model)
                body = body_type.model_validate_json(raw)
        except pydantic.ValidationError:
            await self.app(scope, _replay(raw, receive), send)
            return
        except VectorpressError as exc:
            await vectorpress_error_response(path, exc)(scope, receive, send)
            return
        scope["route"] = route
        try:
            payload, result = await handler(model, body, _priority(scope))
        except VectorpressError as exc:
            await vectorpress_error_response(path, exc)(scope, receive, send)
            return
        except Exception:
            log.exception("unexpected error on %s", path)
            await internal_error_response(path)(scope, receive, send)
            return
        content = await answers.json_body(payload)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(content)).encode()),
        ]
        headers += [(k.encode(), v.encode()) for k, v in timing_headers(result).items()]
        exchange = scope.get(EXCHANGE)
        if isinstance(exchange, Exchange) and exchange.respond(200, headers, content):
            return
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": content})


def _priority(scope: Scope) -> str | None:
    """The `x-priority` header, as the FastAPI routes read it."""
    for name, value in scope["headers"]:
        if name == b"x-priority":
            return str(value.decode("latin-1"))
    return None


def _replay(raw: bytes, receive: Receive) -> Receive:
    """A receive that gives the body already read once, then listens to the client again."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": raw, "more_body": False}
        return await receive()

    return replay
