"""Which served model a request is for: a `/models/<name>/` path prefix, else the body's
`model` field, else the default model.

The prefix mounts every model's whole TEI route table, so a TEI client given the base URL
`http://host/models/<name>` works unchanged. `PrefixRouting` strips the prefix before anything
else sees the path (guards, the direct routes, FastAPI's router, error bodies), and leaves the
name in the scope for `model_for` to resolve.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from vectorpress.api.state import AppState, ModelState, get_state
from vectorpress.core.infer import Infer

log = logging.getLogger(__name__)

PREFIX = "/models/"
#: Where PrefixRouting leaves the name the path gave.
SCOPE_KEY = "vectorpress.model"


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


def resolve(state: AppState, scope: Mapping[str, Any], model: str | None) -> ModelState:
    """The model for a request: the path's name wins over the body's `model`."""
    named = scope.get(SCOPE_KEY)
    if named is None:
        return state.models.get(model)
    found = state.models.get(named)
    if model is not None and model not in found.names:
        # As TEI's OpenAI route does for a name that is not its own: served anyway, logged.
        log.warning("the path names model %r, the body %r; serving %r", named, model, named)
    return found


def model_for(request: Request, model: str | None = None) -> ModelState:
    """The served model `request` is for (raises ModelNotFoundError for an unknown name)."""
    return resolve(get_state(request), request.scope, model)


def infer_for(request: Request, model: str | None = None) -> Infer:
    """The pipeline of the model `request` is for (raises ModelNotFoundError)."""
    return model_for(request, model).infer
