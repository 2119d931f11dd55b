"""The direct inference routes: same bodies accepted as FastAPI's, everything else handed on."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import orjson
import pydantic
import pytest
from starlette.types import Receive, Scope, Send

from vectorpress.api.direct import DirectRoute, DirectRoutes
from vectorpress.api.native import schemas
from vectorpress.api.openai.schemas import EmbeddingsRequest
from vectorpress.api.routing import PrefixRouting
from vectorpress.api.state import AppState, ModelState
from vectorpress.core.infer import Result
from vectorpress.core.models import Models
from vectorpress.errors import OverloadedError, ValidationError
from vectorpress.settings import ServerSettings

MODELS: list[type[pydantic.BaseModel]] = [
    schemas.EmbedRequest,
    schemas.EmbedAllRequest,
    schemas.EmbedSparseRequest,
    schemas.SimilarityRequest,
    schemas.PredictRequest,
    schemas.RerankRequest,
    EmbeddingsRequest,
]

BODIES = [
    '{"inputs": "a text"}',
    '{"inputs": ["a", "b"], "normalize": false, "truncate": true}',
    '{"inputs": [1, 2, 3]}',
    '{"inputs": [[1, 2], [3]]}',
    '{"inputs": [1.0, 2]}',
    '{"inputs": ["a", 1]}',
    '{"inputs": [["a", "b"], ["c", "d"]]}',
    '{"inputs": [["a", "b", "c"]]}',
    '{"inputs": "x", "truncation_direction": "left"}',
    '{"inputs": "x", "truncation_direction": "Up"}',
    '{"inputs": "x", "normalize": 1}',
    '{"inputs": "x", "normalize": "true"}',
    '{"inputs": "x", "dimensions": 8}',
    '{"inputs": "x", "dimensions": "8"}',
    '{"inputs": "x", "dimensions": 8.0}',
    '{"inputs": "x", "prompt_name": null}',
    '{"inputs": "x", "unknown": {"deep": [1, 2]}}',
    '{"inputs": "first", "inputs": "second"}',
    '{"inputs": "caf\\u00e9 \\ud83d\\ude00"}',
    '{"inputs": "lone \\ud800 surrogate"}',
    '{"inputs": [4294967295]}',
    '{"inputs": [4294967296]}',
    '{"inputs": [-1]}',
    '{"inputs": [99999999999999999999999]}',
    '{"inputs": NaN}',
    '{"inputs": []}',
    '{"inputs": null}',
    '{"input": "x", "encoding_format": "base64", "model": "m"}',
    '{"input": [[1, 2]], "dimensions": 3}',
    '{"input": "x", "dimensions": true}',
    '{"input": "x", "encoding_format": "hex"}',
    '{"query": "q", "texts": ["a", "b"], "return_text": true, "raw_scores": false}',
    '{"query": "q", "texts": "a"}',
    '{"query": "q", "texts": ["a"], "truncate": true, "truncation_direction": "Left"}',
    '{"inputs": {"source_sentence": "s", "sentences": ["a", "b"]}}',
    '{"inputs": {"source_sentence": "s", "sentences": ["a"]}, "parameters": {"truncate": true}}',
    '{"inputs": "x", "raw_scores": true}',
    "[]",
    '"text"',
    "null",
    "{}",
]


def framework(model: type[pydantic.BaseModel], raw: str) -> pydantic.BaseModel | None:
    """What a FastAPI route with this body type accepts: the standard parser, then the model."""
    try:
        return model.model_validate(json.loads(raw))
    except (ValueError, pydantic.ValidationError):
        return None


def direct(model: type[pydantic.BaseModel], raw: str) -> pydantic.BaseModel | None:
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError:
        return None


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_json_parsing_accepts_exactly_what_the_framework_accepts(
    model: type[pydantic.BaseModel],
) -> None:
    accepted = 0
    for raw in BODIES:
        ours, theirs = direct(model, raw), framework(model, raw)
        if ours is None:
            continue  # the framework answers these itself, whatever it decides
        assert theirs is not None, f"{model.__name__} accepts {raw} that FastAPI refuses"
        assert ours.model_dump() == theirs.model_dump(), raw
        accepted += 1
    assert accepted >= 2


class Inner:
    """The app behind the direct routes: records what reaches it and answers 418."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 418, "headers": []})
        await send({"type": "http.response.body", "body": b"inner"})


class Named:
    """What routing reads of a served model: its names (the handlers here answer alone)."""

    def __init__(self, *names: str) -> None:
        self.names = names


async def echo(state: ModelState, body: Any, priority: str | None) -> tuple[Any, Result[Any]]:
    inputs = body.input if isinstance(body, EmbeddingsRequest) else body.inputs
    if inputs == "overloaded":
        raise OverloadedError()
    if inputs == "invalid":
        raise ValidationError("Input validation error: no")
    if inputs == "bug":
        raise RuntimeError("a bug")
    return {"echo": inputs, "model": state.names[0]}, Result(None, chars=7, tokens=3)


def _by_name(state: ModelState) -> tuple[type[pydantic.BaseModel], Any]:
    if state.names[0] == "ranker":
        return schemas.RerankRequest, lambda s, b, p: echo_query(s, b, p)
    return schemas.EmbedRequest, echo


async def echo_query(state: ModelState, body: Any, priority: str | None) -> tuple[Any, Result[Any]]:
    return {"query": body.query, "model": state.names[0]}, Result(None)


def serve(inner: Inner, *names: tuple[str, ...]) -> httpx.AsyncClient:
    routes = [
        DirectRoute("/embed", schemas.EmbedRequest, echo),
        DirectRoute("/v1/embeddings", EmbeddingsRequest, echo),
        DirectRoute.per_model("/", _by_name),
    ]
    models = Models([Named(*n) for n in (names or (("m",),))])
    state = AppState(ServerSettings(), models)  # type: ignore[arg-type]
    app = PrefixRouting(DirectRoutes(inner, state=state, routes=routes), state)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://vp")


def test_valid_bodies_are_answered_without_the_framework() -> None:
    async def main() -> None:
        inner = Inner()
        async with serve(inner) as client:
            ok = await client.post("/embed", content=b'{"inputs": "hi", "extra": 1}')
            assert ok.status_code == 200 and ok.json() == {"echo": "hi", "model": "m"}
            assert ok.headers["content-type"] == "application/json"
            assert ok.headers["x-compute-tokens"] == "3"
            assert ok.headers["x-compute-characters"] == "7"
            assert ok.headers["content-length"] == str(len(ok.content))
        assert inner.bodies == []

    asyncio.run(main())


def test_everything_else_reaches_the_framework_with_its_body() -> None:
    async def main() -> None:
        inner = Inner()
        async with serve(inner) as client:
            bad = b'{"inputs": 12}'
            assert (await client.post("/embed", content=bad)).status_code == 418
            assert (await client.post("/embed", content=b"{not json")).status_code == 418
            assert (await client.get("/embed")).status_code == 418
            other = await client.post("/rerank", content=b'{"query": "q", "texts": ["a"]}')
            assert other.status_code == 418
        assert inner.bodies == [bad, b"{not json", b"", b'{"query": "q", "texts": ["a"]}']

    asyncio.run(main())


def test_handler_errors_use_the_error_table() -> None:
    async def main() -> None:
        async with serve(Inner()) as client:
            busy = await client.post("/embed", json={"inputs": "overloaded"})
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
            assert busy.json()["error_type"] == "Overloaded"
            invalid = await client.post("/embed", json={"inputs": "invalid"})
            assert invalid.status_code == 422
            assert invalid.json() == {
                "error": "Input validation error: no",
                "error_type": "Validation",
            }
            bug = await client.post("/embed", json={"inputs": "bug"})
            assert bug.status_code == 500
            assert bug.json() == {"error": "internal error", "error_type": "Backend"}
            openai = await client.post("/v1/embeddings", json={"input": "invalid"})
            assert openai.status_code == 422
            assert openai.json() == {
                "message": "Input validation error: no",
                "code": 422,
                "type": "Validation",
            }

    asyncio.run(main())


def test_large_bodies_arrive_in_pieces() -> None:
    async def main() -> None:
        inner = Inner()
        text = "word " * 50_000
        async with serve(inner) as client:

            async def chunks():  # type: ignore[no-untyped-def]
                raw = orjson.dumps({"inputs": text})
                for i in range(0, len(raw), 4096):
                    yield raw[i : i + 4096]

            ok = await client.post("/embed", content=chunks())
            assert ok.status_code == 200 and ok.json() == {"echo": text, "model": "m"}
        assert inner.bodies == []

    asyncio.run(main())


def test_the_body_or_the_path_names_the_model() -> None:
    async def main() -> None:
        inner = Inner()
        names = (("embedder", "e"), ("org/ranker",), ("ranker",))
        async with serve(inner, *names) as client:
            default = await client.post("/embed", json={"inputs": "x"})
            assert default.json()["model"] == "embedder"
            alias = await client.post("/embed", json={"inputs": "x", "model": "e"})
            assert alias.json()["model"] == "embedder"
            by_body = await client.post("/embed", json={"inputs": "x", "model": "org/ranker"})
            assert by_body.json()["model"] == "org/ranker"
            by_path = await client.post("/models/org/ranker/embed", json={"inputs": "x"})
            assert by_path.json()["model"] == "org/ranker"
            # The body type of POST / is the named model's.
            root = await client.post("/", json={"query": "q", "texts": ["a"], "model": "ranker"})
            assert root.json() == {"query": "q", "model": "ranker"}
            prefixed = await client.post("/models/ranker/", json={"query": "q", "texts": ["a"]})
            assert prefixed.json() == {"query": "q", "model": "ranker"}
            unknown = await client.post("/embed", json={"inputs": "x", "model": "nope"})
            assert unknown.status_code == 404
            assert unknown.json()["error_type"] == "NotFound"
            assert unknown.json()["models"] == ["embedder", "org/ranker", "ranker"]
            openai = await client.post("/models/nope/v1/embeddings", json={"input": "x"})
            assert openai.status_code == 404 and openai.json()["code"] == "model_not_found"
            assert "embedder, org/ranker, ranker" in openai.json()["message"]
        assert inner.bodies == []

    asyncio.run(main())


def test_with_one_model_any_name_is_that_model() -> None:
    async def main() -> None:
        async with serve(Inner(), ("only",)) as client:
            for path, body in (
                ("/embed", {"inputs": "x", "model": "whatever"}),
                ("/models/whatever/embed", {"inputs": "x"}),
                ("/v1/embeddings", {"input": "x", "model": "text-embedding-3-small"}),
            ):
                answer = await client.post(path, json=body)
                assert answer.status_code == 200 and answer.json()["model"] == "only", path

    asyncio.run(main())
