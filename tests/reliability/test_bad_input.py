"""Malformed requests on every route: each gets a JSON error with the right status, and the
next request is served correctly."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.helpers.server import LiveServer
from vectorpress.settings import Settings

LIMIT = 200_000
BATCH = 4
MAX_CHARS = 256 * 250


def deep(n: int) -> bytes:
    return b'{"inputs": ' + b"[" * n + b"]" * n + b"}"


# (route, JSON payload or raw bytes, content type, expected status)
EMBEDDING_CASES: list[tuple[str, Any, str, int]] = [
    ("/embed", b'{"inputs": ', "application/json", 400),
    ("/embed", b"[1, 2", "application/json", 400),
    ("/embed", b'{"inputs": "\xff\xfe broken utf-8"}', "application/json", 400),
    ("/embed", deep(20_000), "application/json", 400),
    ("/embed", {"inputs": 5}, "application/json", 422),
    ("/embed", {"inputs": None}, "application/json", 422),
    ("/embed", {"inputs": {"a": 1}}, "application/json", 422),
    ("/embed", {"inputs": 1.5}, "application/json", 422),
    ("/embed", {}, "application/json", 422),
    ("/embed", ["not", "an", "object"], "application/json", 422),
    ("/embed", {"inputs": "x", "truncate": "yes"}, "application/json", 422),
    ("/embed", {"inputs": "x", "normalize": None}, "application/json", 422),
    ("/embed", {"inputs": "x", "dimensions": -1}, "application/json", 422),
    ("/embed", {"inputs": "x", "dimensions": 0}, "application/json", 422),
    ("/embed", {"inputs": "x", "dimensions": 10**30}, "application/json", 422),
    ("/embed", {"inputs": "x", "dimensions": 385}, "application/json", 422),
    ("/embed", {"inputs": "x", "truncation_direction": "up"}, "application/json", 422),
    ("/embed", {"inputs": ""}, "application/json", 400),
    ("/embed", {"inputs": []}, "application/json", 400),
    ("/embed", {"inputs": ["a", ""]}, "application/json", 400),
    ("/embed", {"inputs": ["a"] * (BATCH + 1)}, "application/json", 422),
    ("/embed", {"inputs": "word " * 600, "truncate": False}, "application/json", 422),
    ("/embed", {"inputs": "a" * (MAX_CHARS + 1), "truncate": False}, "application/json", 422),
    ("/embed", {"inputs": "x", "prompt_name": "nope"}, "application/json", 422),
    ("/embed", {"inputs": [[99_999_999]]}, "application/json", 422),
    ("/embed", {"inputs": [-1]}, "application/json", 422),
    ("/embed", {"inputs": "x"}, "text/plain", 415),
    ("/embed", {"inputs": "y" * (LIMIT + 10)}, "application/json", 413),
    ("/embed_all", {"inputs": ""}, "application/json", 400),
    ("/embed_all", {"inputs": 1.5}, "application/json", 422),
    ("/embed_sparse", {"inputs": "dense model"}, "application/json", 424),
    ("/similarity", {"inputs": {"source_sentence": "a"}}, "application/json", 422),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, "application/json", 400),
    (
        "/similarity",
        {"inputs": {"source_sentence": "a", "sentences": ["b"] * BATCH}},
        "application/json",
        422,
    ),
    ("/similarity", {"inputs": "a string"}, "application/json", 422),
    ("/rerank", {"query": "q", "texts": ["a"]}, "application/json", 424),
    ("/predict", {"inputs": "embedding model"}, "application/json", 424),
    ("/tokenize", {"inputs": ""}, "application/json", 400),
    ("/tokenize", {"inputs": 7}, "application/json", 422),
    ("/tokenize", {"inputs": "a" * (MAX_CHARS + 1)}, "application/json", 422),
    ("/decode", {"ids": []}, "application/json", 400),
    ("/decode", {"ids": [[]]}, "application/json", 400),
    ("/decode", {"ids": "abc"}, "application/json", 422),
    ("/decode", {"ids": [-5]}, "application/json", 422),
    ("/v1/embeddings", {"input": ""}, "application/json", 400),
    ("/v1/embeddings", {"input": None}, "application/json", 422),
    ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, "application/json", 422),
    ("/v1/embeddings", {"input": "x", "dimensions": 0}, "application/json", 422),
    ("/v1/embeddings", {"input": ["x"] * (BATCH + 1)}, "application/json", 422),
    ("/v1/embeddings", b"{", "application/json", 400),
    ("/", {"unexpected": True}, "application/json", 422),
    ("/invocations", b"nope", "application/json", 400),
    ("/vertex", {"instances": "x"}, "application/json", 422),
]

RERANKER_CASES: list[tuple[str, Any, str, int]] = [
    ("/rerank", {"query": "q", "texts": []}, "application/json", 400),
    ("/rerank", {"texts": ["a"]}, "application/json", 422),
    ("/rerank", {"query": "q", "texts": [1, 2]}, "application/json", 422),
    ("/rerank", {"query": "q", "texts": ["a"] * (BATCH + 1)}, "application/json", 422),
    ("/predict", {"inputs": [["a", "b", "c"]]}, "application/json", 422),
    ("/predict", {"inputs": []}, "application/json", 400),
    ("/predict", {"inputs": "x", "raw_scores": "x"}, "application/json", 422),
    ("/embed", {"inputs": "reranker model"}, "application/json", 424),
]


def _send(srv: LiveServer, route: str, payload: Any, ctype: str) -> httpx.Response:
    body = (
        payload
        if isinstance(payload, bytes)
        else httpx.Request("POST", "http://x", json=payload).content
    )
    return httpx.post(
        f"{srv.url}{route}", content=body, headers={"content-type": ctype}, timeout=60
    )


def _check(
    srv: LiveServer, cases: list[tuple[str, Any, str, int]], healthy: Callable[[], None]
) -> None:
    failures = []
    for route, payload, ctype, status in cases:
        response = _send(srv, route, payload, ctype)
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.status_code != status or not isinstance(body, dict):
            failures.append(
                f"{route} {str(payload)[:60]!r}: {response.status_code} "
                f"{response.text[:120]!r}, expected {status} with a JSON error"
            )
            continue
        keys = {"message", "code", "type"} if route == "/v1/embeddings" else {"error", "error_type"}
        if not keys <= set(body):
            failures.append(f"{route}: error body {body} lacks {keys}")
        healthy()
    assert not failures, "\n".join(failures)


@pytest.fixture(scope="module")
def embedding_server(minilm: Path) -> Iterator[LiveServer]:
    settings = Settings.single(str(minilm), max_client_batch_size=BATCH, payload_limit=LIMIT)
    with LiveServer(settings) as srv:
        yield srv


def test_embedding_routes_refuse_bad_input_and_keep_serving(
    embedding_server: LiveServer,
) -> None:
    srv = embedding_server
    reference = np.array(httpx.post(f"{srv.url}/embed", json={"inputs": "reference"}).json())

    def healthy() -> None:
        got = np.array(httpx.post(f"{srv.url}/embed", json={"inputs": "reference"}).json())
        assert np.allclose(got, reference, atol=1e-6), "a bad request changed later answers"

    _check(srv, EMBEDDING_CASES, healthy)
    # A NUL character is valid text, not an error; it must not break the tokenizer either.
    nul = httpx.post(f"{srv.url}/embed", json={"inputs": "a\u0000b"})
    assert nul.status_code == 200 and len(nul.json()[0]) == 384
    healthy()


def test_reranker_routes_refuse_bad_input_and_keep_serving(
    tiny_bert_family: Callable[..., Path],
) -> None:
    folder = tiny_bert_family("bert", "reranker")
    settings = Settings.single(str(folder), max_client_batch_size=BATCH)
    with LiveServer(settings) as srv:
        good = {"query": "what is it", "texts": ["this", "that"]}
        reference = httpx.post(f"{srv.url}/rerank", json=good).json()

        def healthy() -> None:
            assert httpx.post(f"{srv.url}/rerank", json=good).json() == reference

        _check(srv, RERANKER_CASES, healthy)


#: (body, TEI's message after "Failed to parse the request body as JSON: "): serde_json's
#: words and positions, as axum's Json extractor answers them with a 400.
SERDE_REFUSALS: list[tuple[bytes, str]] = [
    (deep(200), "recursion limit exceeded at line 1 column 138"),
    (deep(20_000), "recursion limit exceeded at line 1 column 138"),
    (
        b'{"inputs": "a", "extra": ' + b'{"a":' * 130 + b"1" + b"}" * 130 + b"}",
        "recursion limit exceeded at line 1 column 656",
    ),
    (b'{"inputs": "\xff\xfe broken utf-8"}', "invalid unicode code point at line 1 column 28"),
    (b'{"inp\xffuts": "a"}', "invalid unicode code point at line 1 column 10"),
    (
        b'{\n  "inputs": [\n    "fine",\n    "\xc3"\n  ]\n}',
        "invalid unicode code point at line 4 column 7",
    ),
    (b'{"inputs": "\\ud800"}', "unexpected end of hex escape at line 1 column 19"),
    (b'{"inputs": "\\udc00"}', "lone leading surrogate in hex escape at line 1 column 18"),
    (b'{"inputs": "\\ud800\\u0041"}', "lone leading surrogate in hex escape at line 1 column 24"),
]


@pytest.mark.parametrize(("body", "message"), SERDE_REFUSALS)
@pytest.mark.parametrize("route", ["/embed", "/tokenize", "/v1/embeddings", "/"])
def test_bodies_serde_json_refuses_get_its_message(
    embedding_server: LiveServer, route: str, body: bytes, message: str
) -> None:
    if route == "/v1/embeddings":
        body = body.replace(b'"inputs"', b'"input" ')  # the same columns
    response = httpx.post(
        f"{embedding_server.url}{route}",
        content=body,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert response.status_code == 400, response.text
    text = response.json().get("message" if route == "/v1/embeddings" else "error")
    assert text == f"Failed to parse the request body as JSON: {message}"


def test_what_serde_json_takes_is_not_refused(embedding_server: LiveServer) -> None:
    """127 levels, a paired surrogate and an escaped backslash before `u` parse (then fail or
    pass on their shape)."""
    url = embedding_server.url
    json_type = {"content-type": "application/json"}
    assert httpx.post(f"{url}/embed", content=deep(126), headers=json_type).status_code == 422
    for text in (b'"\\ud83d\\ude00 ok"', b'"\\\\ud800"'):
        response = httpx.post(
            f"{url}/embed",
            content=b'{"inputs": ' + text + b"}",
            timeout=60,
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 200, response.text
