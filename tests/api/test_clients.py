"""Real clients, unmodified, against a live server on the real all-MiniLM-L6-v2.

The `openai` SDK on /v1/embeddings, `huggingface_hub.InferenceClient` on the HF inference
routes and `tei-client`'s HTTP client on TEI's own routes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from tests.api.conftest import post
from tests.helpers.server import LiveServer
from vectorpress.settings import Settings

FOOD = "A man is eating food."
BREAD = "A man is eating a piece of bread."
MOVIE = "The new movie is awful."
NAME = "all-minilm-test"


@pytest.fixture(scope="module")
def minilm_server(minilm: Path) -> Iterator[LiveServer]:
    with LiveServer(Settings.single(str(minilm), served_model_name=NAME)) as srv:
        yield srv


@pytest.fixture(scope="module")
def oai(minilm_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{minilm_server.url}/v1", api_key="unused", max_retries=0)


def embed(server: LiveServer, inputs: object) -> np.ndarray:
    response = post(server, "/embed", {"inputs": inputs})
    assert response.status_code == 200, response.text
    return np.array(response.json(), dtype=np.float32)


def test_openai_sdk_defaults_ask_for_base64(oai: openai.OpenAI, minilm_server: LiveServer) -> None:
    raw = oai.embeddings.with_raw_response.create(input=[FOOD, BREAD, MOVIE], model=NAME)
    assert json.loads(raw.http_request.content)["encoding_format"] == "base64"
    result = raw.parse()
    vectors = np.array([d.embedding for d in result.data], dtype=np.float32)
    assert [d.index for d in result.data] == [0, 1, 2]
    assert result.model == NAME and result.object == "list"
    assert vectors.shape == (3, 384)
    assert abs(vectors[0] @ vectors[1] - 0.7553) < 1e-3
    assert abs(vectors[0] @ vectors[2] - (-0.0164)) < 1e-3
    # Bit for bit what /embed returns for the same inputs.
    np.testing.assert_array_equal(vectors, embed(minilm_server, [FOOD, BREAD, MOVIE]))
    tokens = sum(
        len(t)
        for t in minilm_server.infer.tokenizers._new_tokenizer().encode_batch([FOOD, BREAD, MOVIE])
    )
    assert result.usage.prompt_tokens == result.usage.total_tokens == tokens


def test_base64_decodes_to_exactly_the_float_vectors(minilm_server: LiveServer) -> None:
    texts = [FOOD, "héllo wörld ✓", "x " * 300]
    as_float = post(minilm_server, "/v1/embeddings", {"input": texts, "encoding_format": "float"})
    as_b64 = post(minilm_server, "/v1/embeddings", {"input": texts, "encoding_format": "base64"})
    assert as_float.status_code == as_b64.status_code == 200
    floats = np.array([d["embedding"] for d in as_float.json()["data"]], dtype=np.float32)
    decoded = np.stack(
        [
            np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
            for d in as_b64.json()["data"]
        ]
    )
    np.testing.assert_array_equal(decoded, floats)
    assert as_b64.json()["usage"] == as_float.json()["usage"]
    for header in ("x-compute-tokens", "x-compute-characters", "x-inference-time"):
        assert as_b64.headers[header].isdigit()


def test_openai_float_dimensions_and_token_ids(
    oai: openai.OpenAI, minilm_server: LiveServer
) -> None:
    floats = oai.embeddings.create(input=FOOD, model=NAME, encoding_format="float")
    assert len(floats.data) == 1
    np.testing.assert_array_equal(
        np.array(floats.data[0].embedding, dtype=np.float32), embed(minilm_server, FOOD)[0]
    )
    short = oai.embeddings.create(input=[FOOD, BREAD], model=NAME, dimensions=128)
    for d in short.data:
        assert len(d.embedding) == 128
        assert abs(np.linalg.norm(d.embedding) - 1) < 1e-5
    tok = minilm_server.infer.tokenizers._new_tokenizer()
    food_ids, bread_ids = tok.encode(FOOD).ids, tok.encode(BREAD).ids
    one = oai.embeddings.create(input=food_ids, model=NAME)
    two = oai.embeddings.create(input=[food_ids, bread_ids], model="another-name", user="u1")
    want = embed(minilm_server, [FOOD, BREAD])
    np.testing.assert_allclose([one.data[0].embedding], want[:1], atol=1e-6)
    np.testing.assert_allclose([d.embedding for d in two.data], want, atol=1e-6)
    # The request's model name is only compared; the answer names the served model.
    assert two.model == NAME
    assert two.usage.prompt_tokens == len(food_ids) + len(bread_ids)


def test_openai_errors_in_openai_shape(oai: openai.OpenAI, minilm_server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as empty:
        oai.embeddings.create(input="", model=NAME)
    assert empty.value.status_code == 400
    assert empty.value.response.json() == {
        "message": "Input validation error: `inputs` cannot be empty",
        "code": 400,
        "type": "Empty",
    }
    with pytest.raises(openai.UnprocessableEntityError) as too_many:
        oai.embeddings.create(input=["a"] * 33, model=NAME)
    assert too_many.value.response.json() == {
        "message": "batch size 33 > maximum allowed batch size 32",
        "code": 422,
        "type": "Validation",
    }
    with pytest.raises(openai.UnprocessableEntityError) as dims:
        oai.embeddings.create(input="a", model=NAME, dimensions=385)
    assert dims.value.response.json()["type"] == "Validation"
    for body, status in (
        ({"input": "a", "encoding_format": "hex"}, 422),
        ({"model": NAME}, 422),
    ):
        response = post(minilm_server, "/embeddings", body)
        assert response.status_code == status
        assert set(response.json()) == {"message", "code", "type"}
        assert response.json()["code"] == status
    malformed = httpx.post(
        f"{minilm_server.url}/v1/embeddings",
        content=b"{",
        headers={"content-type": "application/json"},
    )
    assert malformed.status_code == 400 and malformed.json()["code"] == 400


def test_openai_route_always_uses_auto_truncate(
    minilm_server: LiveServer, embedding_server: LiveServer
) -> None:
    long_text = "word " * 600
    ok = post(minilm_server, "/v1/embeddings", {"input": long_text, "truncate": False})
    assert ok.status_code == 200 and ok.json()["usage"]["total_tokens"] == 256
    # embedding_server runs with --auto-truncate false.
    refused = post(embedding_server, "/v1/embeddings", {"input": long_text})
    assert refused.status_code == 422
    assert refused.json() == {
        "message": "Input validation error: `inputs` must have less than 128 tokens. Given: 602",
        "code": 422,
        "type": "Validation",
    }


def test_inference_client(minilm_server: LiveServer, inference_client: Callable[..., Any]) -> None:
    client = inference_client(minilm_server.url)
    features = client.feature_extraction(FOOD)
    assert features.shape == (1, 384) and features.dtype == np.float32
    np.testing.assert_array_equal(features, embed(minilm_server, FOOD))
    batch = client.feature_extraction([FOOD, BREAD], normalize=False, truncate=True)
    raw = post(minilm_server, "/embed", {"inputs": [FOOD, BREAD], "normalize": False}).json()
    np.testing.assert_array_equal(batch, np.array(raw, dtype=np.float32))
    similarity = inference_client(f"{minilm_server.url}/similarity").sentence_similarity(
        FOOD, [BREAD, MOVIE]
    )
    assert similarity == pytest.approx([0.7553, -0.0164], abs=1e-3)


def test_tei_client(minilm_server: LiveServer, embedding_server: LiveServer) -> None:
    from tei_client import HttpClient

    client = HttpClient(minilm_server.url, timeout=60)
    assert client.health()
    info = client.info()
    assert info.server_model_type.value == "embedding"
    assert info.server_model_metadata.pooling == "mean"
    assert info.max_input_length == 256
    vectors = np.array(client.embed([FOOD, BREAD, MOVIE]), dtype=np.float32)
    np.testing.assert_array_equal(vectors, embed(minilm_server, [FOOD, BREAD, MOVIE]))
    per_token = client.embed_all(FOOD)
    tokens = client.tokenize(FOOD)[0]
    assert len(per_token[0]) == len(tokens.tokens) == len(tokens.get_ids())
    assert tokens.tokens[0].special and tokens.tokens[1].text == "A"
    assert client.decode(tokens.get_ids()) == [FOOD.lower()]
    # tei-client reads the prompt names out of the unknown-prompt error message.
    assert HttpClient(embedding_server.url).prompt_names() == ["passage", "query"]
