"""Which served model a request is for: a `/models/<name>/` path prefix, an `x-model` header
(as gRPC's `x-model` metadata), the body's `model` field, else the default model.

The prefix mounts every model's whole TEI route table, so a TEI client given the base URL
`http://host/models/<name>` works unchanged. `PrefixRouting` strips the prefix before anything
else sees the path (guards, the direct routes, FastAPI's router, error bodies), and leaves the
name in the scope for `model_for` to resolve.

The ways in must agree (see `resolve`): nothing is silently served by a model the caller did
not mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from vectorpress.api.state import AppState, ModelState, get_state
from vectorpress.core.infer import Infer
from vectorpress.errors import ModelConflictError

PREFIX = "/models/"
#: Where PrefixRouting leaves the name the path gave.
SCOPE_KEY = "vectorpress.model"
#: The request header that names the model, as gRPC's metadata key.
HEADER = b"x-model"


def split_prefix(path: str, names: tuple[str, ...]) -> tuple[str, str] | None:
    """(name, the rest of the path) for a path under /models/, else None.

    `names` longest first: a served name may hold a '/' (`org/model`), so the longest that
    fits wins; a name nobody serves is the next path segment, and resolving it fails later,
    after the API key check.
    """
    if not path.startswith(PREFIX):
        return None
    tail = path[len(PREFIX) :]
    for name in names:
        if tail == name or tail.startswith(name + "/"):
            return name, tail[len(name) :] or "/"
    name, _, rest = tail.partition("/")
    return (name, "/" + rest) if name else None


class PrefixRouting:
    """Pure ASGI: `/models/<name>/embed` becomes `/embed` for model `name`."""

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.names = state.models.all_names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            found = split_prefix(scope["path"], self.names)
            if found is not None:
                name, rest = found
                # In place, as routing marks the scope: the layers outside (the tracing
                # middleware's span name) read what the layers inside wrote into it.
                scope["path"], scope["raw_path"], scope[SCOPE_KEY] = rest, rest.encode(), name
        await self.app(scope, receive, send)


def header_name(scope: Mapping[str, Any]) -> str | None:
    """The `x-model` header's name, None when absent or blank."""
    for key, value in scope.get("headers", ()):
        if key == HEADER:
            name = value.decode("latin-1").strip()
            return name or None
    return None


def named(scope: Mapping[str, Any]) -> bool:
    """Whether the path or the header names one model (`/health`, `/metrics`: that model's
    rather than every model's)."""
    return SCOPE_KEY in scope or header_name(scope) is not None


def resolve(state: AppState, scope: Mapping[str, Any], model: str | None) -> ModelState:
    """The model for a request, from its path prefix, `x-model` header and body `model`.

    The path and the header name a model outright: an unknown name there is 404, and the two
    naming different models is 400. The body's `model` picks the model when neither does;
    when one does, the body must not name another served model (400), and a name nobody
    serves is let through (OpenAI's SDKs send a `model` whatever the base URL). Aliases of
    one model agree. With one model served any name is accepted, as in TEI.
    """
    models = state.models
    ways = (("the path", scope.get(SCOPE_KEY)), ("the x-model header", header_name(scope)))
    given = [(where, name) for where, name in ways if name is not None]
    if not given:
        return models.get(model)
    where, name = given[0]
    found = models.get(name)
    for other_where, other in given[1:]:
        if models.get(other) is not found:
            raise _conflict(where, name, other_where, other)
    if model is not None and model not in found.names and models.serves(model):
        raise _conflict(where, name, "the body's `model`", model)
    return found


def _conflict(where: str, name: str, other_where: str, other: str) -> ModelConflictError:
    return ModelConflictError(
        f"{where} names model {name!r} and {other_where} names model {other!r}: "
        "name one model, or the same one each time"
    )


def model_for(request: Request, model: str | None = None) -> ModelState:
    """The served model `request` is for (raises ModelNotFoundError for an unknown name,
    ModelConflictError when its path, header and body disagree)."""
    return resolve(get_state(request), request.scope, model)


def infer_for(request: Request, model: str | None = None) -> Infer:
    """The pipeline of the model `request` is for (raises as `model_for`)."""
    return model_for(request, model).infer
