"""The foundation over a real socket, on the real all-MiniLM-L6-v2."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers.reference import assert_close_vectors, st_encode
from tests.helpers.server import TIMING_HEADERS, LiveServer
from tests.helpers.texts import mixed_texts
from vectorpress.settings import Settings

TEXTS = mixed_texts(64, seed=11)


@pytest.fixture(scope="module")
def server(minilm: Path) -> Iterator[LiveServer]:
    with LiveServer(Settings.single(str(minilm), max_batch_tokens=4096)) as srv:
        yield srv


def embed(server: LiveServer, payload: dict[str, object]) -> httpx.Response:
    return httpx.post(f"{server.url}/embed", json=payload, timeout=60)


def test_parity_with_sentence_transformers(server: LiveServer, minilm: Path) -> None:
    tokens = [len(server.infer.tokenizers._new_tokenizer().encode(t).ids) for t in TEXTS]
    assert len(TEXTS) >= 50 and sum(n > 256 for n in tokens) >= 5, "corpus must need truncation"
    got: list[list[float]] = []
    for i in range(0, len(TEXTS), 32):
        response = embed(server, {"inputs": TEXTS[i : i + 32]})
        assert response.status_code == 200, response.text
        got.extend(response.json())
    want = st_encode(minilm, TEXTS)
    assert_close_vectors(got, want, min_cos=0.99999, what="minilm")


def test_golden_similarities(server: LiveServer) -> None:
    texts = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The new movie is awful.",
    ]
    v = np.array(embed(server, {"inputs": texts}).json())
    assert abs(v[0] @ v[1] - 0.7553) < 1e-3
    assert abs(v[0] @ v[2] - (-0.0164)) < 1e-3


def test_text_alone_equals_text_in_mixed_batch(server: LiveServer) -> None:
    batch = TEXTS[:32]
    together = embed(server, {"inputs": batch}).json()
    for i in (0, 3, 7, 31):
        alone = embed(server, {"inputs": batch[i]}).json()
        assert_close_vectors(alone, [together[i]], min_cos=0.99999, what=f"text {i}")


def test_single_string_gives_list_of_one_unit_vector(server: LiveServer) -> None:
    response = embed(server, {"inputs": "hello"})
    assert response.status_code == 200
    body = response.json()
    assert len(body) == 1 and len(body[0]) == 384
    assert abs(np.linalg.norm(body[0]) - 1.0) < 1e-5
    for header in TIMING_HEADERS:
        assert header in response.headers
    assert response.headers["x-compute-characters"] == "5"
    assert response.headers["x-compute-tokens"] == "3"


def test_embed_options(server: LiveServer) -> None:
    raw = embed(server, {"inputs": "hello", "normalize": False}).json()[0]
    assert abs(np.linalg.norm(raw) - 1.0) > 1e-3
    short = embed(server, {"inputs": "hello", "dimensions": 128}).json()[0]
    assert len(short) == 128 and abs(np.linalg.norm(short) - 1.0) < 1e-5
    ids = server.infer.tokenizers._new_tokenizer().encode("hello").ids
    by_ids = embed(server, {"inputs": ids}).json()
    by_text = embed(server, {"inputs": "hello"}).json()
    assert_close_vectors(by_ids, by_text, what="token ids")
    long_text = "word " * 600
    left = embed(server, {"inputs": long_text + "end", "truncation_direction": "Left"})
    assert left.status_code == 200


def test_error_shapes(server: LiveServer) -> None:
    cases = [
        ({"inputs": ""}, 400, "Empty"),
        ({"inputs": []}, 400, "Empty"),
        ({"inputs": ["a"] * 33}, 422, "Validation"),
        ({"inputs": "word " * 600, "truncate": False}, 422, "Validation"),
        ({"inputs": "hi", "dimensions": 0}, 422, "Validation"),
        ({"inputs": "hi", "dimensions": 385}, 422, "Validation"),
        ({"inputs": "hi", "prompt_name": "nope"}, 422, "Validation"),
        ({"inputs": 5}, 422, "Validation"),
        ({"inputs": [99999999]}, 422, "Validation"),
        ({}, 422, "Validation"),
    ]
    for payload, status, error_type in cases:
        response = embed(server, payload)
        assert response.status_code == status, (payload, response.text)
        body = response.json()
        assert set(body) == {"error", "error_type"} and body["error_type"] == error_type, body
    bad_json = httpx.post(
        f"{server.url}/embed",
        content=b'{"inputs": "x',
        headers={"content-type": "application/json"},
    )
    assert bad_json.status_code == 400 and bad_json.json()["error_type"] == "Validation"
    no_type = httpx.post(
        f"{server.url}/embed", content=b'{"inputs": "x"}', headers={"content-type": "text/plain"}
    )
    assert no_type.status_code == 415 and "error" in no_type.json()
    # Unknown fields are ignored, and the server still answers normally.
    assert embed(server, {"inputs": "ok", "surprise": 1}).status_code == 200


def test_info_and_health(server: LiveServer) -> None:
    info = httpx.get(f"{server.url}/info").json()
    assert list(info) == [
        "model_id",
        "model_sha",
        "model_dtype",
        "served_model_name",
        "model_type",
        "max_concurrent_requests",
        "max_input_length",
        "max_batch_tokens",
        "max_batch_requests",
        "max_client_batch_size",
        "auto_truncate",
        "tokenization_workers",
        "version",
        "sha",
        "docker_label",
        # Extensions after TEI's fields, so that TEI's own order holds.
        "windowed_inputs",
        "window_overlap",
    ]
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 256 and info["model_dtype"] == "float32"
    for path in ("/health", "/", "/ping"):
        response = httpx.get(f"{server.url}{path}")
        assert response.status_code == 200 and response.content == b""
    assert httpx.get(f"{server.url}/api-doc/openapi.json").json()["paths"]["/embed"]
    assert httpx.get(f"{server.url}/docs").status_code == 200


def test_admission_answers_429_never_hangs(minilm: Path) -> None:
    settings = Settings.single(str(minilm), max_concurrent_requests=4)
    text = " ".join(TEXTS[3].split()[:180])
    with LiveServer(settings) as srv:

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as client:
                responses = await asyncio.gather(
                    *(client.post(f"{srv.url}/embed", json={"inputs": text}) for _ in range(50))
                )
            for r in responses:
                if r.status_code == 429:
                    assert r.json() == {"error": "Model is overloaded", "error_type": "Overloaded"}
                    assert r.headers["retry-after"]
            return [r.status_code for r in responses]

        statuses = asyncio.run(asyncio.wait_for(burst(), 120))
        assert set(statuses) <= {200, 429}, statuses
        assert 200 in statuses and 429 in statuses, statuses
        after = httpx.post(f"{srv.url}/embed", json={"inputs": "still here"}, timeout=30)
        assert after.status_code == 200
        assert srv.infer.admission.available == 4
