"""The one place a request's model is resolved to the Infer that serves it."""

from __future__ import annotations

from starlette.requests import Request

from vectorpress.api.state import get_state
from vectorpress.core.infer import Infer


def infer_for(request: Request, model: str | None) -> Infer:
    """The pipeline of the model a request names. One model is served, so any name reaches it
    (clients of other providers always send one)."""
    return get_state(request).infer
