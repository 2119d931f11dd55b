"""The inference POSTs' short way through the app (api/lane.py), on a live server: taken only
where the layers it skips would not act, and answering as the whole stack does."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
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
from vectorpress.api.protocol import Exchange
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


# -- the answer written through the request's Exchange ------------------------------------------


def _request(path: str, body: bytes, *extra: str, version: str = "1.1") -> bytes:
    head = [f"POST {path} HTTP/{version}", "Host: vp", "Content-Type: application/json"]
    head += [*extra, f"Content-Length: {len(body)}"]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _answers(sock: socket.socket, count: int) -> list[tuple[bytes, list[tuple[str, str]], bytes]]:
    """`count` whole answers read off `sock`: status line, headers in order, body."""
    sock.settimeout(30)
    data = b""
    out: list[tuple[bytes, list[tuple[str, str]], bytes]] = []
    while len(out) < count:
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(out)} answers"
            data += chunk
        head, data = data.split(b"\r\n\r\n", 1)
        status, *lines = head.split(b"\r\n")
        headers = [(k.lower(), v.strip()) for k, v in (x.decode().split(":", 1) for x in lines)]
        length = int(dict(headers)["content-length"])
        while len(data) < length:
            chunk = sock.recv(65536)
            assert chunk, "connection closed inside a body"
            data += chunk
        out.append((status, headers, data[:length]))
        data = data[length:]
    assert data == b"", "bytes after the answers"
    return out


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(10)
    return sock.recv(1) == b""


@pytest.fixture
def responded(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """What each Exchange.respond call returned (True: the answer went past the ASGI sends)."""
    seen: list[bool] = []
    original = Exchange.respond

    def spy(self: Exchange, *args: Any) -> bool:
        seen.append(original(self, *args))
        return seen[-1]

    monkeypatch.setattr(Exchange, "respond", spy)
    return seen


VARYING = {
    "date",
    "x-compute-time",
    "x-total-time",
    "x-tokenization-time",
    "x-queue-time",
    "x-inference-time",
}


def test_a_lane_answer_is_written_as_uvicorns_sends_write_it(
    embedding_server: LiveServer, responded: list[bool]
) -> None:
    """The same request on one kept-alive connection: without Origin its answer is written
    through the Exchange in one call, with Origin through CORS's and uvicorn's sends; the heads
    are the same, header by header, but for CORS's own and the times."""
    body = json.dumps({"inputs": ["a lane", "two texts"]}).encode()
    with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
        sock.sendall(_request("/embed", body))
        laned = _answers(sock, 1)[0]
        sock.sendall(_request("/embed", body, f"Origin: {ORIGIN['origin']}"))
        full = _answers(sock, 1)[0]
        # Pipelined: both in one write, answered in order on the same connection.
        sock.sendall(_request("/embed", body) + _request("/embed", b'{"inputs": "x"}'))
        first, second = _answers(sock, 2)
    assert responded == [True, False, True, True]
    assert laned[0] == full[0] == first[0] == b"HTTP/1.1 200 OK"
    cors = [(k, v) for k, v in full[1] if not k.startswith("access-control-") and k != "vary"]
    assert [k for k, _ in laned[1]] == [k for k, _ in cors] == [k for k, _ in first[1]]
    assert [kv for kv in laned[1] if kv[0] not in VARYING] == [
        kv for kv in cors if kv[0] not in VARYING
    ]
    assert [k for k, _ in laned[1][:2]] == ["date", "server"]  # uvicorn's defaults first
    assert json.loads(laned[2]) == json.loads(full[2]) == json.loads(first[2])
    assert len(json.loads(second[2])) == 1


@pytest.mark.parametrize(
    ("extra", "version"), [(("Connection: close",), "1.1"), ((), "1.0")], ids=["close", "http10"]
)
def test_a_lane_answer_ends_a_connection_that_does_not_stay(
    embedding_server: LiveServer, responded: list[bool], extra: tuple[str, ...], version: str
) -> None:
    with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
        sock.sendall(_request("/embed", b'{"inputs": "x"}', *extra, version=version))
        status, headers, _ = _answers(sock, 1)[0]
        assert _closed(sock)
    assert responded == [True]
    assert status == b"HTTP/1.1 200 OK" and ("connection", "close") in headers
    # The server goes on with the next connection.
    assert post(embedding_server, "/embed", {"inputs": "y"}).status_code == 200


def test_an_access_log_takes_uvicorns_send(
    embedding_server: LiveServer, responded: list[bool], caplog: pytest.LogCaptureFixture
) -> None:
    """uvicorn's `send` writes the access line: with access lines on, the answer goes there."""
    caplog.set_level(logging.INFO, logger="uvicorn.access")
    with socket.create_connection(("127.0.0.1", embedding_server.port)) as sock:
        sock.sendall(_request("/embed", b'{"inputs": "x"}'))
        assert _answers(sock, 1)[0][0] == b"HTTP/1.1 200 OK"
    assert responded == [False]
    lines = [r.getMessage() for r in caplog.records if r.name == "uvicorn.access"]
    assert any('"POST /embed HTTP/1.1" 200' in line for line in lines), lines


_TELEMETRY_PROBE = """
import sys
from tests.api.test_lane import _built
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

app = _built()
scope = {"type": "http", "method": "POST", "path": "/embed", "headers": []}
before = app._takes_lane(scope)
if sys.argv[1] == "set":
    trace.set_tracer_provider(TracerProvider())
print(before, app._takes_lane(scope))
"""


@pytest.mark.parametrize(
    ("how", "env", "want"),
    [
        ("set", {}, "True False"),
        ("none", {}, "True True"),
        ("none", {"OTEL_PYTHON_TRACER_PROVIDER": "sdk_tracer_provider"}, "False False"),
    ],
    ids=["provider-set-later", "no-provider", "provider-named-in-the-environment"],
)
def test_a_configured_opentelemetry_provider_turns_the_lane_off(
    how: str, env: dict[str, str], want: str
) -> None:
    """FastAPI's own telemetry must see every request once a provider exists, however it came
    (a process of its own: a provider is set once per process)."""
    import os

    out = subprocess.run(
        [sys.executable, "-c", _TELEMETRY_PROBE, how],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        check=True,
    )
    assert out.stdout.split("\n")[-2] == want, out.stderr
