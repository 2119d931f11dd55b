"""TEI's embedding-model routes over a live socket: shapes, values, prompts, headers, errors."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from tests.api.conftest import assert_error, post
from tests.helpers.reference import assert_close_vectors
from tests.helpers.server import TIMING_HEADERS, LiveServer
from vectorpress.settings import Settings


def ids_of(server: LiveServer, text: str, special: bool = True) -> list[int]:
    return list(
        server.infer.tokenizers._new_tokenizer().encode(text, add_special_tokens=special).ids
    )


def hidden_states(folder: Path, text: str) -> np.ndarray:
    """transformers' last hidden state for one text: the reference of /embed_all."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder).eval()
    with torch.no_grad():
        out = model(**tok(text, return_tensors="pt")).last_hidden_state[0]
    return out.numpy()


def test_embed_shapes_and_inputs(embedding_server: LiveServer) -> None:
    single = post(embedding_server, "/embed", {"inputs": "hello world"})
    assert single.status_code == 200
    assert np.array(single.json()).shape == (1, 32)
    batch = post(embedding_server, "/embed", {"inputs": ["hello world", "a second text"]}).json()
    assert np.array(batch).shape == (2, 32)
    assert_close_vectors(single.json(), batch[:1], what="single vs batch")
    # A flat id list is one input; a list of id lists is a batch; ids and text may mix.
    ids = ids_of(embedding_server, "hello world")
    by_ids_response = post(embedding_server, "/embed", {"inputs": ids})
    # For token-id inputs TEI counts ids as characters.
    assert by_ids_response.headers["x-compute-characters"] == str(len(ids))
    by_ids = by_ids_response.json()
    mixed = post(embedding_server, "/embed", {"inputs": [ids, "a second text"]}).json()
    assert len(by_ids) == 1 and len(mixed) == 2
    assert_close_vectors(by_ids + mixed[1:], batch, what="ids")
    raw = np.array(post(embedding_server, "/embed", {"inputs": "hi", "normalize": False}).json())
    assert abs(np.linalg.norm(raw) - 1) > 1e-3
    short = post(embedding_server, "/embed", {"inputs": "hi", "dimensions": 8}).json()[0]
    assert len(short) == 8 and abs(np.linalg.norm(short) - 1) < 1e-6
    np.testing.assert_allclose(short, raw[0][:8] / np.linalg.norm(raw[0][:8]), atol=1e-6)


def test_truncate_falls_back_to_auto_truncate(embedding_server: LiveServer) -> None:
    long_text = "word " * 200  # 202 tokens; the model takes 128
    # The server runs with --auto-truncate false, so an omitted `truncate` refuses.
    assert_error(
        post(embedding_server, "/embed", {"inputs": long_text}),
        422,
        "Validation",
        "Input validation error: `inputs` must have less than 128 tokens. Given: 202",
    )
    assert_error(
        post(embedding_server, "/embed", {"inputs": long_text, "truncate": None}), 422, "Validation"
    )
    ok = post(embedding_server, "/embed", {"inputs": long_text, "truncate": True})
    assert ok.status_code == 200 and ok.headers["x-compute-tokens"] == "128"
    # Left truncation keeps the end of the text, so the two directions differ.
    text = "alpha beta gamma " + "word " * 200 + "omega end"
    right = post(embedding_server, "/embed", {"inputs": text, "truncate": True}).json()
    left = post(
        embedding_server,
        "/embed",
        {"inputs": text, "truncate": True, "truncation_direction": "left"},
    ).json()
    assert not np.allclose(right, left)


def test_embed_all_is_the_last_hidden_state(
    embedding_server: LiveServer, embedding_folder: Path
) -> None:
    response = post(embedding_server, "/embed_all", {"inputs": ["hello world", "a"]})
    assert response.status_code == 200
    for header in TIMING_HEADERS:
        assert header in response.headers
    got = response.json()
    assert [len(t) for t in got] == [4, 3]  # special tokens included
    np.testing.assert_allclose(got[0], hidden_states(embedding_folder, "hello world"), atol=1e-4)
    prompted = post(embedding_server, "/embed_all", {"inputs": "a", "prompt_name": "query"}).json()
    assert len(prompted[0]) == 3 + 2  # "query", ":"


def test_prompts(embedding_server: LiveServer) -> None:
    with_name = post(embedding_server, "/embed", {"inputs": "hello", "prompt_name": "query"})
    by_hand = post(embedding_server, "/embed", {"inputs": "query: hello"})
    assert_close_vectors(with_name.json(), by_hand.json(), min_cos=0.999999, what="prompt")
    plain = post(embedding_server, "/embed", {"inputs": "hello"}).json()
    assert not np.allclose(plain, with_name.json())
    assert with_name.headers["x-compute-characters"] == "5"
    assert with_name.headers["x-compute-tokens"] == str(
        len(ids_of(embedding_server, "query: hello"))
    )
    assert_error(
        post(embedding_server, "/embed", {"inputs": "hello", "prompt_name": "nope"}),
        422,
        "Validation",
        "Input validation error: prompt `nope` was not found in the Sentence Transformers "
        'prompts. Available prompts: ["passage", "query"]',
    )


def test_similarity(embedding_server: LiveServer) -> None:
    sentences = ["a cat sits on the mat", "stock markets fell", "a cat on a mat"]
    body = {"inputs": {"source_sentence": "the cat sat on the mat", "sentences": sentences}}
    response = post(embedding_server, "/similarity", body)
    assert response.status_code == 200
    for header in TIMING_HEADERS:
        assert header in response.headers
    scores = response.json()
    vectors = np.array(
        post(
            embedding_server,
            "/embed",
            {"inputs": ["the cat sat on the mat", *sentences], "normalize": False},
        ).json(),
        dtype=np.float64,
    )
    want = [v @ vectors[0] / np.linalg.norm(v) / np.linalg.norm(vectors[0]) for v in vectors[1:]]
    np.testing.assert_allclose(scores, want, atol=1e-6)
    with_params = {**body, "parameters": {"prompt_name": "query", "truncate": True}}
    assert post(embedding_server, "/similarity", with_params).status_code == 200
    empty = {"inputs": {"source_sentence": "x", "sentences": []}}
    assert_error(post(embedding_server, "/similarity", empty), 400, "Empty")
    # The source counts against --max-client-batch-size (8 here).
    many = {"inputs": {"source_sentence": "x", "sentences": ["y"] * 8}}
    assert_error(
        post(embedding_server, "/similarity", many),
        422,
        "Validation",
        "batch size 9 > maximum allowed batch size 8",
    )


def test_tokenize(embedding_server: LiveServer) -> None:
    response = post(embedding_server, "/tokenize", {"inputs": "héllo world"})
    assert response.status_code == 200
    assert not any(h.startswith("x-") for h in response.headers)
    assert response.json() == [
        [
            {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None},
            {"id": 7592, "text": "héllo", "special": False, "start": 0, "stop": 6},
            {"id": 2088, "text": "world", "special": False, "start": 7, "stop": 12},
            {"id": 102, "text": "[SEP]", "special": True, "start": None, "stop": None},
        ]
    ]
    bare = post(
        embedding_server, "/tokenize", {"inputs": ["hello", "a b"], "add_special_tokens": False}
    ).json()
    assert [[t["id"] for t in one] for one in bare] == [[7592], [1037, 1038]]
    prompted = post(embedding_server, "/tokenize", {"inputs": "hello", "prompt_name": "query"})
    assert [t["text"] for t in prompted.json()[0]] == ["[CLS]", "query", ":", "hello", "[SEP]"]
    assert prompted.json()[0][3]["start"] == 7
    assert_error(post(embedding_server, "/tokenize", {"inputs": ""}), 400, "Empty")
    assert_error(post(embedding_server, "/tokenize", {"inputs": []}), 400, "Empty")
    # No truncation here: the character limit (128 tokens x 250) always refuses.
    assert_error(
        post(embedding_server, "/tokenize", {"inputs": "a" * 32001}),
        422,
        "Validation",
        "Input validation error: `inputs` must have less than 32000 characters. Given: 32001",
    )


def test_decode(embedding_server: LiveServer) -> None:
    ids = [101, 7592, 2088, 102]
    assert post(embedding_server, "/decode", {"ids": ids}).json() == ["hello world"]
    both = post(embedding_server, "/decode", {"ids": [ids, [7592]], "skip_special_tokens": False})
    assert both.json() == ["[CLS] hello world [SEP]", "hello"]
    assert_error(
        post(embedding_server, "/decode", {"ids": []}),
        400,
        "Empty",
        "Input validation error: `input_ids` cannot be empty",
    )
    assert_error(post(embedding_server, "/decode", {"ids": [10**9]}), 422, "Validation")


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/embed", {"inputs": ["a", "b"]}),
        ("/embed_all", {"inputs": ["a", "b"]}),
        ("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}),
        ("/v1/embeddings", {"input": ["a", "b"]}),
    ],
)
def test_timing_headers(embedding_server: LiveServer, path: str, payload: object) -> None:
    response = post(embedding_server, path, payload)
    assert response.status_code == 200
    assert response.headers["x-compute-type"] == "gpu+optimized"
    for header in TIMING_HEADERS[1:]:
        assert response.headers[header].isdigit(), header
    assert response.headers["x-compute-time"] == response.headers["x-total-time"]
    assert response.headers["x-compute-characters"] == "2"
    # [CLS] a [SEP] and [CLS] b [SEP]
    assert response.headers["x-compute-tokens"] == "6"


def test_embedding_error_table(embedding_server: LiveServer) -> None:
    """Each error row of TEI's table that an embedding model can meet, over the socket."""
    empty = "Input validation error: `inputs` cannot be empty"
    cases: list[tuple[str, object, int, str, str]] = [
        ("/embed", {"inputs": ""}, 400, "Empty", empty),
        ("/embed", {"inputs": []}, 400, "Empty", empty),
        ("/embed", {"inputs": ["a", ""]}, 400, "Empty", empty),
        ("/embed_all", {"inputs": ""}, 400, "Empty", empty),
        (
            "/embed",
            {"inputs": ["a"] * 9},
            422,
            "Validation",
            "batch size 9 > maximum allowed batch size 8",
        ),
        (
            "/embed",
            {"inputs": "a" * 32001, "truncate": False},
            422,
            "Validation",
            "Input validation error: `inputs` must have less than 32000 characters. Given: 32001",
        ),
        (
            "/embed",
            {"inputs": "hi", "dimensions": 0},
            422,
            "Validation",
            "Input validation error: `dimensions` should be positive",
        ),
        (
            "/embed",
            {"inputs": "hi", "dimensions": 33},
            422,
            "Validation",
            "Input validation error: `dimensions` should be smaller than the maximum embedding "
            "dimension.",
        ),
        (
            "/embed",
            {"inputs": [30522]},
            422,
            "Validation",
            "Input validation error: token id 30522 is outside the vocabulary (size 30522)",
        ),
        (
            "/predict",
            {"inputs": "hi"},
            424,
            "Backend",
            "Backend error: Model is not a classifier model",
        ),
        (
            "/rerank",
            {"query": "q", "texts": ["a"]},
            424,
            "Backend",
            "Backend error: model is not a re-ranker model",
        ),
        (
            "/embed_sparse",
            {"inputs": "hi"},
            424,
            "Backend",
            "Backend error: Model is not an embedding model with SPLADE pooling",
        ),
        ("/vertex", {"instances": [{"inputs": "a"}, {"nothing": 1}]}, 422, "Validation", ""),
        ("/embed", {"inputs": 5}, 422, "Validation", ""),
        ("/embed", {"inputs": "x", "truncation_direction": "middle"}, 422, "Validation", ""),
        ("/embed", {"inputs": "x", "normalize": "yes"}, 422, "Validation", ""),
        ("/embed", {}, 422, "Validation", ""),
    ]
    for path, payload, status, error_type, message in cases:
        assert_error(post(embedding_server, path, payload), status, error_type, message)
    # A long text is cut at the character limit when truncating, and then by tokens.
    ok = post(embedding_server, "/embed", {"inputs": "a " * 20000, "truncate": True})
    assert ok.status_code == 200 and ok.headers["x-compute-tokens"] == "128"
    # Unknown fields are ignored.
    assert post(embedding_server, "/embed", {"inputs": "x", "surprise": [1]}).status_code == 200


def test_framework_errors_are_json(embedding_server: LiveServer) -> None:
    url = embedding_server.url
    malformed = httpx.post(
        f"{url}/embed", content=b'{"inputs": ', headers={"content-type": "application/json"}
    )
    assert_error(malformed, 400, "Validation")
    assert malformed.json()["error"].startswith("Failed to parse the request body as JSON")
    wrong_shape = post(embedding_server, "/embed", {"inputs": {"a": 1}})
    assert_error(wrong_shape, 422, "Validation")
    assert wrong_shape.json()["error"].startswith(
        "Failed to deserialize the JSON body into the target type"
    )
    no_type = httpx.post(f"{url}/embed", content=b'{"inputs": "x"}')
    assert_error(
        no_type, 415, "Validation", "Expected request with `Content-Type: application/json`"
    )
    assert httpx.post(f"{url}/nowhere", json={}).status_code == 404
    assert httpx.post(f"{url}/nowhere", json={}).json()["error_type"] == "NotFound"
    assert httpx.get(f"{url}/embed").status_code == 405
    assert httpx.get(f"{url}/embed").json()["error_type"] == "MethodNotAllowed"


def test_default_route_and_vertex(embedding_server: LiveServer) -> None:
    want = post(embedding_server, "/embed", {"inputs": ["a", "b"]}).json()
    for path in ("/", "/invocations"):
        response = post(embedding_server, path, {"inputs": ["a", "b"]})
        assert response.status_code == 200 and response.headers["x-compute-tokens"] == "6"
        assert_close_vectors(response.json(), want, what=path)
    vertex = post(
        embedding_server, "/vertex", {"instances": [{"inputs": "a"}, {"inputs": ["a", "b"]}]}
    )
    assert vertex.status_code == 200
    assert not any(h.startswith("x-") for h in vertex.headers)
    predictions = vertex.json()["predictions"]
    assert list(vertex.json()) == ["predictions"] and len(predictions) == 2
    assert_close_vectors(predictions[0] + predictions[1], want[:1] + want, what="vertex")
    # The first failing instance decides the answer.
    assert_error(
        post(embedding_server, "/vertex", {"instances": [{"inputs": "a"}, {"inputs": ""}]}),
        400,
        "Empty",
    )


def test_info_and_openapi(embedding_server: LiveServer) -> None:
    info = httpx.get(f"{embedding_server.url}/info").json()
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["max_input_length"] == 128 and info["auto_truncate"] is False
    assert info["max_client_batch_size"] == 8
    doc = httpx.get(f"{embedding_server.url}/api-doc/openapi.json").json()
    for path in (
        "/embed",
        "/embed_all",
        "/embed_sparse",
        "/predict",
        "/rerank",
        "/similarity",
        "/tokenize",
        "/decode",
        "/v1/embeddings",
        "/vertex",
        "/info",
        "/health",
        "/metrics",
    ):
        assert path in doc["paths"], path
    assert "requestBody" in doc["paths"]["/rerank"]["post"]
    # Every documented example request is a valid body (an embedding model refuses the
    # cross-encoder routes by kind, not by shape).
    schemas = doc["components"]["schemas"]
    tried = 0
    for path, ops in doc["paths"].items():
        body = ops.get("post", {}).get("requestBody")
        if body is None:
            continue
        schema = body["content"]["application/json"]["schema"]
        # A path two dialects share takes either's body (api/clash.py).
        for one in schema.get("anyOf", [schema]):
            ref = one["$ref"].rsplit("/", 1)[-1]
            for example in schemas[ref].get("examples", []):
                response = post(embedding_server, path, example)
                assert response.status_code in (200, 424), (path, response.text)
                tried += 1
    assert tried >= 10
    docs = httpx.get(f"{embedding_server.url}/docs")
    assert docs.status_code == 200 and "swagger" in docs.text.lower()


def test_default_prompt_name(embedding_folder: Path, embedding_server: LiveServer) -> None:
    settings = Settings.single(str(embedding_folder), default_prompt_name="query")
    with LiveServer(settings) as srv:

        def same(got: httpx.Response, text: str) -> None:
            assert got.status_code == 200, got.text
            want = post(embedding_server, "/embed", {"inputs": text}).json()
            vectors = got.json()
            if isinstance(vectors, dict):  # OpenAI's shape
                vectors = [d["embedding"] for d in vectors["data"]]
            assert_close_vectors(vectors, want, min_cos=0.999999, what=text)

        same(post(srv, "/embed", {"inputs": "hello"}), "query: hello")
        same(post(srv, "/embed", {"inputs": "hello", "prompt_name": "passage"}), "passage: hello")
        same(post(srv, "/v1/embeddings", {"input": "hello"}), "query: hello")
        # Token ids with a prompt are decoded, prompted and encoded again.
        same(post(srv, "/embed", {"inputs": ids_of(srv, "hello")}), "query: hello")
        tokens = post(srv, "/tokenize", {"inputs": "hello"}).json()[0]
        assert [t["text"] for t in tokens] == ["[CLS]", "query", ":", "hello", "[SEP]"]


def test_pooled_and_raw_requests_share_batches_correctly(embedding_server: LiveServer) -> None:
    """Concurrent /embed, /embed_all and /similarity answer as they do one at a time."""
    texts = [f"text number {i} " + "word " * (i * 7 % 40) for i in range(24)]
    bodies = [
        ("/embed", {"inputs": texts[i : i + 3], "truncate": True}) for i in range(0, 24, 3)
    ] + [("/embed_all", {"inputs": texts[i], "truncate": True}) for i in range(0, 24, 4)]
    bodies.append(
        ("/similarity", {"inputs": {"source_sentence": texts[0], "sentences": texts[1:5]}})
    )
    alone = [post(embedding_server, path, body).json() for path, body in bodies]

    async def together() -> list[object]:
        async with httpx.AsyncClient(base_url=embedding_server.url, timeout=60) as client:
            responses = await asyncio.gather(
                *(client.post(path, json=body) for path, body in bodies * 3)
            )
        assert all(r.status_code == 200 for r in responses)
        return [r.json() for r in responses]

    for i, got in enumerate(asyncio.run(together())):
        want = alone[i % len(bodies)]
        np.testing.assert_allclose(
            np.concatenate([np.ravel(x) for x in got]),
            np.concatenate([np.ravel(x) for x in want]),
            atol=1e-5,
            err_msg=str(bodies[i % len(bodies)][0]),
        )
