"""With --api-key, every protected route refuses a missing or wrong key and leaks nothing."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.server import LiveServer
from vectorpress.settings import Settings

KEY = "vp-key-7f3a9c"
HF_TOKEN = "hf_tokenvalue5521"
OPEN = {
    ("GET", "/health"),
    ("GET", "/"),
    ("GET", "/ping"),
    ("GET", "/metrics"),
    ("GET", "/docs"),
    ("GET", "/docs/oauth2-redirect"),
    ("GET", "/docs/assets/swagger-ui-bundle.js"),
    ("GET", "/docs/assets/swagger-ui.css"),
    ("GET", "/api-doc/openapi.json"),
}
PROTECTED = [
    ("GET", "/info", None),
    ("POST", "/embed", {"inputs": "x"}),
    ("POST", "/embed_all", {"inputs": "x"}),
    ("POST", "/embed_sparse", {"inputs": "x"}),
    ("POST", "/embed_multi", {"inputs": "x"}),
    ("POST", "/predict", {"inputs": "x"}),
    ("POST", "/rerank", {"query": "q", "texts": ["x"]}),
    ("POST", "/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}),
    ("POST", "/tokenize", {"inputs": "x"}),
    ("POST", "/decode", {"ids": [101]}),
    ("POST", "/v1/embeddings", {"input": "x"}),
    ("POST", "/embeddings", {"input": "x"}),
    ("POST", "/vertex", {"instances": [{"inputs": "x"}]}),
    ("POST", "/", {"inputs": "x"}),
    ("POST", "/invocations", {"inputs": "x"}),
    ("POST", "/v2/rerank", {"query": "q", "documents": ["x"]}),
    ("POST", "/v1/rerank", {"query": "q", "documents": ["x"]}),
    ("POST", "/v2/embed", {"texts": ["x"], "input_type": "search_query"}),
    ("POST", "/v1/embed", {"texts": ["x"]}),
    ("POST", "/score", {"text_1": "a", "text_2": "b"}),
    ("POST", "/v1/score", {"text_1": "a", "text_2": "b"}),
    ("POST", "/classify", {"input": ["x"]}),
    ("POST", "/v1/classify", {"input": ["x"]}),
    ("POST", "/detokenize", {"tokens": [101]}),
    ("GET", "/models", None),
    ("GET", "/v1/models", None),
    # Under a model's prefix too: the key is checked on the path without it.
    ("POST", "/models/any/embed", {"inputs": "x"}),
    ("GET", "/models/any/info", None),
]


@pytest.fixture(scope="module")
def server(minilm: Path) -> Iterator[LiveServer]:
    with LiveServer(Settings.single(str(minilm), api_key=KEY, hf_token=HF_TOKEN)) as srv:
        yield srv


def test_every_protected_route_is_listed(server: LiveServer) -> None:
    spec = httpx.get(f"{server.url}/api-doc/openapi.json").json()
    documented = {(m.upper(), p) for p, ops in spec["paths"].items() for m in ops}
    listed = {(m, p) for m, p, _ in PROTECTED}
    assert documented - OPEN <= listed, f"routes without a key test: {documented - OPEN - listed}"


@pytest.mark.parametrize("auth", [None, "Bearer wrong", f"Bearer {KEY}x", KEY, f"bearer {KEY}"])
def test_missing_or_wrong_key_is_refused(
    server: LiveServer, auth: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    headers = {"authorization": auth} if auth else {}
    with caplog.at_level(logging.DEBUG):
        for method, path, body in PROTECTED:
            response = httpx.request(method, f"{server.url}{path}", json=body, headers=headers)
            assert response.status_code == 401, (path, response.status_code)
            assert KEY not in response.text and HF_TOKEN not in response.text
    assert KEY not in caplog.text and HF_TOKEN not in caplog.text


def test_right_key_passes_and_secrets_never_show(
    server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    headers = {"authorization": f"Bearer {KEY}"}
    with caplog.at_level(logging.DEBUG):
        for method, path, body in PROTECTED:
            response = httpx.request(method, f"{server.url}{path}", json=body, headers=headers)
            assert response.status_code != 401, path
            assert KEY not in response.text and HF_TOKEN not in response.text, path
        for method, path in OPEN:
            response = httpx.request(method, f"{server.url}{path}")
            assert response.status_code == 200, path
            assert KEY not in response.text and HF_TOKEN not in response.text, path
    assert KEY not in caplog.text and HF_TOKEN not in caplog.text
    info = httpx.get(f"{server.url}/info", headers=headers).text
    assert KEY not in info and HF_TOKEN not in info
