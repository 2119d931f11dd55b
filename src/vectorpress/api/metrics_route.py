"""GET /metrics, and the same page on its own listener when --prometheus-port is given.

`/models/<name>/metrics` (or `/metrics` with an `x-model` header) is that model's series and
the server-wide ones only: a scrape job per model, each series still labelled `model`.
"""

from __future__ import annotations

import socket

from fastapi import APIRouter, Request
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

from vectorpress.api.routing import model_for, named
from vectorpress.api.state import get_state
from vectorpress.core.metrics import CONTENT_TYPE, Registry
from vectorpress.errors import StartupError

router = APIRouter()


def _page(metrics: Registry, model: str | None = None) -> Response:
    return Response(metrics.render(model), headers={"content-type": CONTENT_TYPE})


@router.get(
    "/metrics",
    tags=["Text Embeddings Inference"],
    summary="Prometheus metrics",
    response_class=Response,
    responses={200: {"content": {"text/plain": {}}}},
)
async def metrics(request: Request) -> Response:
    model = model_for(request).name if named(request.scope) else None
    return _page(get_state(request).registry, model)


def metrics_app(metrics: Registry) -> Starlette:
    """The separate listener: Prometheus text on every GET path, as TEI's exporter answers."""

    async def page(_request: Request) -> Response:
        return _page(metrics)

    return Starlette(routes=[Route("/{path:path}", page, methods=["GET"])])


def bind_listener(host: str, port: int) -> socket.socket:
    """Bind the --prometheus-port socket now, so a taken port stops start-up with one line
    rather than killing a background task later."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"--prometheus-port {port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock
