"""TEI's routes, gathered: `router` needs the API key when one is set, `health_router` never."""

from __future__ import annotations

from fastapi import APIRouter

from vectorpress.api.native import classify, dispatch, embed, status, tokens
from vectorpress.api.native.common import json_response

__all__ = ["health_router", "json_response", "router"]

router = APIRouter()
for _module in (embed, classify, tokens, dispatch):
    router.include_router(_module.router)
router.include_router(status.router)

health_router = APIRouter()
health_router.include_router(status.public_router)
