"""The benchmark's lean HTTP client against a real uvicorn server on a real socket."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator

import orjson
import pytest
import uvicorn
from bench.client import BlockingConnection, Connection
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

PEERS: set[tuple[str, int]] = set()


async def echo(request: Request) -> Response:
    assert request.client is not None
    PEERS.add((request.client.host, request.client.port))
    body = orjson.loads(await request.body())
    return Response(orjson.dumps({"got": body}), media_type="application/json")


async def chunked(request: Request) -> StreamingResponse:
    await request.body()

    async def parts() -> AsyncIterator[bytes]:
        for piece in (b"[1,", b"2,", b"3]"):
            yield piece

    return StreamingResponse(parts(), media_type="application/json")


async def closing(request: Request) -> Response:
    await request.body()
    return Response(b"{}", status_code=503, headers={"connection": "close"})


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    app = Starlette(
        routes=[
            Route("/echo", echo, methods=["POST"]),
            Route("/chunked", chunked, methods=["POST"]),
            Route("/closing", closing, methods=["POST"]),
        ]
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_requests_share_one_kept_alive_connection(url: str) -> None:
    async def main() -> None:
        connection = Connection(url)
        PEERS.clear()
        for i in range(5):
            status, body = await connection.post("/echo", {"inputs": ["text", i]})
            assert status == 200 and orjson.loads(body) == {"got": {"inputs": ["text", i]}}
        await connection.close()
        assert len(PEERS) == 1

    asyncio.run(main())


def test_chunked_replies_and_closed_connections(url: str) -> None:
    async def main() -> None:
        connection = Connection(url)
        assert await connection.post("/chunked", {}) == (200, b"[1,2,3]")
        assert await connection.post("/closing", {}) == (503, b"{}")
        # The server closed that connection: the next request opens another.
        PEERS.clear()
        assert (await connection.post("/echo", 1))[0] == 200
        assert (await connection.post("/echo", 2))[0] == 200
        assert len(PEERS) == 1
        await connection.close()

    asyncio.run(main())


def test_the_blocking_client_reads_the_same_replies(url: str) -> None:
    connection = BlockingConnection(url)
    PEERS.clear()
    for i in range(3):
        status, body = connection.post_raw("/echo", orjson.dumps([i, "x" * 100_000]))
        assert status == 200 and orjson.loads(body) == {"got": [i, "x" * 100_000]}
    assert len(PEERS) == 1
    assert connection.post_raw("/chunked", b"{}") == (200, b"[1,2,3]")
    assert connection.post_raw("/closing", b"{}") == (503, b"{}")
    assert connection.post_raw("/echo", b"7") == (200, b'{"got":7}')
    connection.close()
