"""`priority` in bodies, the `x-priority` header and gRPC metadata pick an input's lane, on every
way in: the direct ASGI routes, FastAPI's, OpenAI's, gRPC. Checked on the queue itself while
the device thread is held, so which lane each request waits in is seen, not inferred."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest

from tests.grpc.clients import Stubs
from tests.helpers.checkpoints import make_m3
from tests.helpers.faulty import FaultyBackend, faulty_factory
from tests.helpers.server import LiveServer
from vectorpress.api.grpc.stubs import pb
from vectorpress.core.queue import Lane
from vectorpress.settings import Settings


@pytest.fixture
def held(minilm: Path) -> Iterator[tuple[LiveServer, FaultyBackend, Stubs]]:
    make, made = faulty_factory()
    # Two inputs at most are interactive by default, so a three-input request is bulk.
    settings = Settings.single(str(minilm), interactive_max_inputs=2)
    with LiveServer(settings, make_backend=make, grpc=True) as srv:
        stubs = Stubs.connect(srv.grpc_target)
        backend = made[0]
        backend.gate = threading.Event()
        backend.started.clear()  # set by the warm-up: the test waits for its own first batch
        try:
            yield srv, backend, stubs
        finally:
            backend.gate.set()
            stubs.channel.close()


def _wait(check: Callable[[], object]) -> None:
    deadline = time.monotonic() + 60
    while (seen := check()) is not True:
        assert time.monotonic() < deadline, f"the request never reached the queue: {seen}"
        time.sleep(0.01)


def test_each_way_in_puts_its_inputs_in_the_lane_it_names(
    held: tuple[LiveServer, FaultyBackend, Stubs],
) -> None:
    srv, backend, stubs = held
    queue = srv.infer.queue

    def waiting() -> tuple[int, int]:
        return queue.waiting(Lane.INTERACTIVE), queue.waiting(Lane.BULK)

    async def scenario() -> list[Any]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=120) as http:
            calls: list[asyncio.Future[Any]] = []

            async def send(expect: tuple[int, int], coro: Any) -> None:
                calls.append(asyncio.ensure_future(coro))
                await asyncio.to_thread(_wait, lambda: waiting() == expect or (waiting(), expect))

            # Holds the device thread at its first forward; what follows waits in the lanes.
            await send((0, 0), http.post("/embed", json={"inputs": "hold the device"}))
            await asyncio.to_thread(backend.started.wait, 60)
            q = "one short query"
            await send((1, 0), http.post("/embed", json={"inputs": q}))  # default: interactive
            await send((1, 3), http.post("/embed", json={"inputs": [q] * 3}))  # default: bulk
            await send(
                (1, 4), http.post("/embed", json={"inputs": q, "priority": "bulk"})
            )  # direct route, body
            await send(
                (1, 5), http.post("/embed", json={"inputs": q}, headers={"x-priority": "bulk"})
            )  # direct route, header
            await send(
                (4, 5),
                http.post(
                    "/embed",
                    json={"inputs": [q] * 3, "priority": "interactive"},
                    headers={"x-priority": "bulk"},
                ),
            )  # the body's field wins over the header
            await send(
                (4, 6),
                http.post(
                    "/vertex", json={"instances": [{"inputs": q}]}, headers={"x-priority": "bulk"}
                ),
            )  # a FastAPI route
            oa = openai.AsyncOpenAI(base_url=f"{srv.url}/v1", api_key="-", max_retries=0)
            await send(
                (4, 7),
                oa.embeddings.create(input=q, model="m", extra_headers={"x-priority": "bulk"}),
            )
            await send(
                (4, 8),
                oa.embeddings.create(input=q, model="m", extra_body={"priority": "bulk"}),
            )
            await send(
                (4, 9),
                asyncio.to_thread(
                    stubs.embed.Embed,
                    pb.EmbedRequest(inputs=q),
                    metadata=(("x-priority", "bulk"),),
                    timeout=120,
                ),
            )
            # vLLM's integer priority: lower runs earlier, 0 leaves it to the request's size.
            await send(
                (7, 9), oa.embeddings.create(input=[q] * 3, model="m", extra_body={"priority": -1})
            )
            await send(
                (7, 10), oa.embeddings.create(input=q, model="m", extra_body={"priority": 1})
            )
            await send(
                (8, 10), oa.embeddings.create(input=q, model="m", extra_body={"priority": 0})
            )
            backend.gate.set()  # type: ignore[union-attr]
            return list(await asyncio.gather(*calls))

    results = asyncio.run(scenario())
    for r in results:
        if isinstance(r, httpx.Response):
            assert r.status_code == 200, r.text


def test_a_bad_priority_is_a_validation_error(
    held: tuple[LiveServer, FaultyBackend, Stubs],
) -> None:
    srv, backend, stubs = held
    backend.gate.set()  # type: ignore[union-attr]
    for bad in ("urgent", True, 1.5):
        r = httpx.post(f"{srv.url}/embed", json={"inputs": "q", "priority": bad}, timeout=60)
        assert r.status_code == 422, bad
    r = httpx.post(
        f"{srv.url}/embed", json={"inputs": "q"}, headers={"x-priority": "urgent"}, timeout=60
    )
    assert r.status_code == 422 and "`priority` must be" in r.json()["error"]
    with pytest.raises(grpc.RpcError) as info:
        stubs.embed.Embed(
            pb.EmbedRequest(inputs="q"), metadata=(("x-priority", "urgent"),), timeout=60
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_the_multi_vector_routes_take_a_lane(tmp_path: Path) -> None:
    """/embed_multi and a bge-m3 model's rerank and score routes (native, Cohere's, vLLM's,
    Infinity's) wait in the lane their body or header names, as every other route."""
    make, made = faulty_factory()
    folder = make_m3(tmp_path / "m3")
    with LiveServer(
        Settings.single(str(folder), interactive_max_inputs=2), make_backend=make
    ) as srv:
        backend = made[0]
        backend.gate = threading.Event()
        backend.started.clear()
        queue = srv.infer.queue

        def waiting() -> tuple[int, int]:
            return queue.waiting(Lane.INTERACTIVE), queue.waiting(Lane.BULK)

        async def scenario() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=srv.url, timeout=120) as http:
                calls: list[asyncio.Future[Any]] = []

                async def send(expect: tuple[int, int], path: str, body: Any, **kw: Any) -> None:
                    calls.append(asyncio.ensure_future(http.post(path, json=body, **kw)))
                    await asyncio.to_thread(
                        _wait, lambda: waiting() == expect or (path, waiting(), expect)
                    )

                await send((0, 0), "/embed", {"inputs": "hold the device"})
                await asyncio.to_thread(backend.started.wait, 60)
                bulk = {"x-priority": "bulk"}
                await send((1, 0), "/embed_multi", {"inputs": "q"})  # default: interactive
                await send((1, 1), "/embed_multi", {"inputs": "q", "priority": "bulk"})
                await send((1, 2), "/embed_multi", {"inputs": "q"}, headers=bulk)
                # A rerank of one text encodes the query and the text: two inputs.
                await send((1, 4), "/rerank", {"query": "q", "texts": ["a"], "priority": "bulk"})
                await send((3, 4), "/rerank", {"query": "q", "texts": ["a"]})
                await send((3, 6), "/score", {"text_1": "q", "text_2": "a"}, headers=bulk)
                await send((3, 8), "/score", {"text_1": "q", "text_2": "a", "priority": "bulk"})
                await send((3, 10), "/v2/rerank", {"query": "q", "documents": ["a"]}, headers=bulk)
                await send(
                    (5, 10),
                    "/v1/rerank",
                    {"query": "q", "documents": ["a"], "priority": "interactive"},
                    headers=bulk,
                )  # the body's field wins over the header
                backend.gate.set()  # type: ignore[union-attr]
                return list(await asyncio.gather(*calls))

        for r in asyncio.run(scenario()):
            assert r.status_code == 200, r.text
        r = httpx.post(f"{srv.url}/embed_multi", json={"inputs": "q", "priority": "now"})
        assert r.status_code == 422, r.text
