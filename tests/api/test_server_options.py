"""--api-key, --cors-allow-origin, --payload-limit, --served-model-name and TASK, live."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.api.conftest import assert_error, post
from tests.helpers.server import LiveServer
from vectorpress.settings import Settings

KEY = "options-key-42"
AUTH = {"authorization": f"Bearer {KEY}"}
ALLOWED = "http://allowed.example"
LIMIT = 4096


@pytest.fixture(scope="module")
def server(embedding_folder: Path) -> Iterator[LiveServer]:
    settings = Settings.single(
        model_id=str(embedding_folder),
        api_key=KEY,
        cors_allow_origin=(ALLOWED,),
        payload_limit=LIMIT,
        served_model_name="tiny-embedder",
        task="sentence-similarity",
    )
    with LiveServer(settings) as srv:
        yield srv


def test_unauthorized_is_json_in_each_dialect(server: LiveServer) -> None:
    tei = post(server, "/embed", {"inputs": "x"})
    assert_error(tei, 401, "Unauthorized", "Unauthorized")
    oai = post(server, "/v1/embeddings", {"input": "x"}, headers={"authorization": "Bearer no"})
    assert oai.status_code == 401
    assert oai.json() == {"message": "Unauthorized", "code": 401, "type": "Unauthorized"}
    # POST / is the model's own route and needs the key; GET / is health and does not.
    assert (
        post(server, "/", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}).status_code
        == 401
    )
    assert httpx.get(f"{server.url}/").status_code == 200
    assert httpx.get(f"{server.url}/info").status_code == 401
    assert httpx.get(f"{server.url}/info", headers=AUTH).json()["served_model_name"] == (
        "tiny-embedder"
    )


def test_clients_send_the_key(server: LiveServer, inference_client: Callable[..., Any]) -> None:
    good = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    result = good.embeddings.create(input=["a", "b"], model="tiny-embedder")
    assert result.model == "tiny-embedder" and len(result.data) == 2
    bad = openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.embeddings.create(input="a", model="tiny-embedder")
    # With TASK=sentence-similarity, POST / answers as /similarity, which is what
    # InferenceClient.sentence_similarity posts to the endpoint's root.
    scores = inference_client(server.url, token=KEY).sentence_similarity("a cat", ["a cat", "dog"])
    want = post(
        server,
        "/similarity",
        {"inputs": {"source_sentence": "a cat", "sentences": ["a cat", "dog"]}},
        headers=AUTH,
    ).json()
    assert scores == want and abs(scores[0] - 1) < 1e-5
    invocations = post(
        server,
        "/invocations",
        {"inputs": {"source_sentence": "a cat", "sentences": ["a cat", "dog"]}},
        headers=AUTH,
    )
    assert invocations.json() == want and invocations.headers["x-compute-tokens"].isdigit()
    # Vertex instances are embed requests even then.
    vertex = post(server, "/vertex", {"instances": [{"inputs": "a cat"}]}, headers=AUTH).json()
    assert np.array(vertex["predictions"][0]).shape == (1, 32)


def test_cors(server: LiveServer, embedding_server: LiveServer) -> None:
    allowed = httpx.get(f"{server.url}/health", headers={"origin": ALLOWED})
    assert allowed.headers["access-control-allow-origin"] == ALLOWED
    other = httpx.get(f"{server.url}/health", headers={"origin": "http://evil.example"})
    assert "access-control-allow-origin" not in other.headers
    preflight = httpx.options(
        f"{server.url}/embed",
        headers={
            "origin": ALLOWED,
            "access-control-request-method": "POST",
            "access-control-request-headers": "content-type, authorization",
        },
    )
    assert preflight.status_code == 200
    assert preflight.headers["access-control-allow-origin"] == ALLOWED
    assert "POST" in preflight.headers["access-control-allow-methods"]
    # Refusals carry CORS headers too, so a browser can read them.
    refused = httpx.post(f"{server.url}/embed", json={"inputs": "x"}, headers={"origin": ALLOWED})
    assert refused.status_code == 401
    assert refused.headers["access-control-allow-origin"] == ALLOWED
    # Without --cors-allow-origin any origin is allowed, as in TEI.
    anyone = post(embedding_server, "/embed", {"inputs": "x"}, headers={"origin": "http://a.b"})
    assert anyone.headers["access-control-allow-origin"] == "*"
    metrics = httpx.get(f"{embedding_server.url}/metrics", headers={"origin": "http://a.b"})
    assert metrics.headers["access-control-allow-origin"] == "*"


def test_payload_limit(server: LiveServer) -> None:
    too_large = {"inputs": "word " * (LIMIT // 5 + 10)}
    message = "Failed to buffer the request body: length limit exceeded"
    assert_error(post(server, "/embed", too_large, headers=AUTH), 413, "Validation", message)
    openai_shape = post(server, "/v1/embeddings", {"input": too_large["inputs"]}, headers=AUTH)
    assert openai_shape.status_code == 413 and openai_shape.json()["code"] == 413

    def chunks() -> Iterator[bytes]:
        # No content-length: the limit must hold while the body streams in.
        yield b'{"inputs": "'
        for _ in range(LIMIT // 100 + 2):
            yield b"w" * 100
        yield b'"}'

    streamed = httpx.post(
        f"{server.url}/embed",
        content=chunks(),
        headers={**AUTH, "content-type": "application/json"},
    )
    assert_error(streamed, 413, "Validation", message)
    # POST / reads its body itself, since its type depends on the model; same limit.
    streamed_root = httpx.post(
        f"{server.url}/", content=chunks(), headers={**AUTH, "content-type": "application/json"}
    )
    assert_error(streamed_root, 413, "Validation", message)
    just_under = {"inputs": "w" * (LIMIT - 100)}
    assert post(server, "/embed", just_under, headers=AUTH).status_code == 200


def test_task_is_read_from_the_environment() -> None:
    from vectorpress.cli import settings_from_args

    env = {"MODEL_ID": "some/model", "TASK": "sentence-similarity"}
    assert settings_from_args(["serve"], env=env).model.task == "sentence-similarity"
    assert settings_from_args(["serve"], env={"MODEL_ID": "some/model"}).model.task is None
