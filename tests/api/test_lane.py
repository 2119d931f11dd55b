"""The inference POSTs' short way through the app (api/lane.py), on a live server: taken only
where the layers it skips would not act, and answering as the whole stack does."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import pytest
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.api.conftest import assert_error, post
from tests.helpers.server import LiveServer
from vectorpress.api.direct import DirectRoutes
from vectorpress.api.lane import LanedApp
from vectorpress.api.routing import PrefixRouting

ORIGIN = {"origin": "https://app.example"}


@pytest.fixture
def outer_calls(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Paths of the requests that passed through the CORS layer (outside the lane)."""
    calls: Counter[str] = Counter()
    original = CORSMiddleware.__call__

    async def counted(self: CORSMiddleware, scope: Scope, receive: Receive, send: Send) -> None:
        calls[scope["path"]] += 1
        await original(self, scope, receive, send)

    monkeypatch.setattr(CORSMiddleware, "__call__", counted)
    return calls


def test_inference_posts_skip_the_outer_layers_and_answer_as_through_them(
    embedding_server: LiveServer, outer_calls: Counter[str]
) -> None:
    assert embedding_server.served is not None
    name = embedding_server.served.state.models.default.names[0]
    body = {"inputs": ["a lane", "two texts"]}
    laned = post(embedding_server, "/embed", body)
    prefixed = post(embedding_server, f"/models/{name}/embed", body)
    openai = post(embedding_server, "/v1/embeddings", {"input": "a lane", "model": name})
    assert outer_calls == Counter(), "an inference POST without Origin went the long way"

    full = post(embedding_server, "/embed", body, headers=ORIGIN)
    assert outer_calls["/embed"] == 1
    assert full.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-origin" not in laned.headers
    assert laned.status_code == prefixed.status_code == full.status_code == 200
    assert laned.json() == prefixed.json() == full.json()
    assert openai.json()["data"][0]["embedding"] == laned.json()[0]
    timing = {k for k in full.headers if k.startswith("x-")}
    assert timing and timing <= set(laned.headers)

    # Everything else goes the long way.
    assert httpx.get(f"{embedding_server.url}/health", timeout=30).status_code == 200
    assert post(embedding_server, "/tokenize", {"inputs": "x"}).status_code == 200
    assert outer_calls["/health"] == 1 and outer_calls["/tokenize"] == 1


def test_bad_bodies_on_the_lane_get_the_same_errors(
    embedding_server: LiveServer, outer_calls: Counter[str]
) -> None:
    bodies = [
        b'{"inputs": 12}',
        b'{"inputs": []}',
        b"{not json",
        b'{"inputs": "x", "dimensions": 0}',
    ]
    for raw in bodies:
        laned, full = (
            httpx.post(
                f"{embedding_server.url}/embed",
                content=raw,
                headers={"content-type": "application/json", **headers},
                timeout=30,
            )
            for headers in ({}, ORIGIN)
        )
        assert 400 <= laned.status_code < 500, raw
        assert_error(laned, full.status_code, full.json()["error_type"], full.json()["error"])
    assert outer_calls["/embed"] == len(bodies)


def test_what_escapes_the_lane_is_the_apps_500_answer(
    embedding_server: LiveServer, outer_calls: Counter[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: DirectRoutes, scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("a bug below the lane")

    monkeypatch.setattr(DirectRoutes, "__call__", broken)
    laned = post(embedding_server, "/embed", {"inputs": "x"})
    full = post(embedding_server, "/embed", {"inputs": "x"}, headers=ORIGIN)
    assert outer_calls["/embed"] == 1
    assert_error(laned, 500, "Backend")
    assert laned.json() == full.json()


class _Spy:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


def _built(*outer: Any) -> LanedApp:
    app = LanedApp(lane_paths=["/embed"])
    app.add_middleware(PrefixRouting, state=_NoModels())
    for layer in outer:
        app.add_middleware(layer)
    app.build_middleware_stack()
    return app


class _NoModels:
    class models:  # what PrefixRouting reads of the state
        all_names: tuple[str, ...] = ()


def test_the_lane_exists_only_with_pass_through_layers_outside() -> None:
    assert _built().laned
    assert _built(CORSMiddleware).laned
    assert not _built(_Spy).laned, "a layer the lane would skip must see every request"
    assert not _built(CORSMiddleware, _Spy).laned
    unbuilt = LanedApp(lane_paths=["/embed"])
    unbuilt.add_middleware(PrefixRouting, state=_NoModels())
    assert not unbuilt.laned, "the lane comes with the stack"
