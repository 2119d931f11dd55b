"""The HTTP application: routers, error handlers, guards, model routing and CORS around one
AppState."""

from __future__ import annotations

from fastapi import Depends, FastAPI
from starlette.middleware.cors import CORSMiddleware

from vectorpress import __version__
from vectorpress.api import bodies, openapi
from vectorpress.api.clash import router as clash_router
from vectorpress.api.cohere.routes import router as cohere_router
from vectorpress.api.direct import DirectRoute, DirectRoutes
from vectorpress.api.disconnect import DisconnectMiddleware
from vectorpress.api.errors import install_error_handlers
from vectorpress.api.guards import GuardMiddleware
from vectorpress.api.lane import LanedApp
from vectorpress.api.metrics_route import router as metrics_router
from vectorpress.api.native import schemas
from vectorpress.api.native.classify import run_predict, run_rerank
from vectorpress.api.native.dispatch import default_route
from vectorpress.api.native.embed import (
    run_embed,
    run_embed_all,
    run_embed_multi,
    run_embed_sparse,
    run_similarity,
)
from vectorpress.api.native.routes import health_router, router
from vectorpress.api.openai.models import router as models_router
from vectorpress.api.openai.routes import router as openai_router
from vectorpress.api.openai.routes import run_embeddings
from vectorpress.api.openai.schemas import EmbeddingsRequest
from vectorpress.api.routing import PrefixRouting
from vectorpress.api.state import AppState
from vectorpress.api.vllm.routes import router as vllm_router


def direct_routes() -> list[DirectRoute]:
    """The inference routes whose valid bodies skip FastAPI (see api/direct.py)."""
    return [
        DirectRoute("/embed", schemas.EmbedRequest, run_embed),
        DirectRoute("/embed_all", schemas.EmbedAllRequest, run_embed_all),
        DirectRoute("/embed_sparse", schemas.EmbedSparseRequest, run_embed_sparse),
        DirectRoute("/embed_multi", schemas.EmbedMultiRequest, run_embed_multi),
        DirectRoute("/similarity", schemas.SimilarityRequest, run_similarity),
        DirectRoute("/predict", schemas.PredictRequest, run_predict),
        DirectRoute("/rerank", schemas.RerankRequest, run_rerank),
        DirectRoute.per_model("/", default_route),
        DirectRoute.per_model("/invocations", default_route),
        DirectRoute("/v1/embeddings", EmbeddingsRequest, run_embeddings),
        DirectRoute("/embeddings", EmbeddingsRequest, run_embeddings),
    ]


def create_app(state: AppState) -> FastAPI:
    routes = direct_routes()
    app = LanedApp(
        title="vectorpress",
        summary="Text embeddings, sparse embeddings, reranking and classification; "
        "compatible with text-embeddings-inference",
        version=__version__,
        # /docs is openapi.install's: Swagger UI from a local package, not a CDN.
        docs_url=None,
        openapi_url="/api-doc/openapi.json",
        redoc_url=None,
        dependencies=[Depends(bodies.refuse_bodies)],
        lane_paths=[route.path for route in routes],
    )
    app.state.vp = state
    install_error_handlers(app)
    app.include_router(router)
    app.include_router(openai_router)
    app.include_router(cohere_router)
    app.include_router(vllm_router)
    app.include_router(clash_router)
    app.include_router(health_router)
    app.include_router(metrics_router)
    settings = state.server
    app.include_router(models_router)
    openapi.install(app, protected=settings.api_key is not None)
    # Middleware added last runs first: CORS answers preflights before the key is checked.
    app.add_middleware(DirectRoutes, state=state, routes=routes)
    app.add_middleware(DisconnectMiddleware)
    app.add_middleware(
        GuardMiddleware, payload_limit=settings.payload_limit, api_key=settings.api_key
    )
    # Outside the guards, so they and everything within see the path without /models/<name>.
    app.add_middleware(PrefixRouting, state=state)
    origins = list(settings.cors_allow_origin or ["*"])
    app.add_middleware(
        CORSMiddleware,
        allow_origins=["*"] if "*" in origins else origins,
        allow_methods=["GET", "POST"],
        # x-model and x-priority: a browser may name the model and the lane as any client.
        allow_headers=["content-type", "authorization", "x-model", "x-priority"],
    )
    if state.tracer is not None:
        from vectorpress.observability.middleware import TracingMiddleware

        # Outermost, so the request span covers every other layer and is current for all.
        app.add_middleware(TracingMiddleware, tracer=state.tracer)
    return app
