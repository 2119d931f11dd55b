"""OpenAI batch-API files in and out, against a live server's /v1/embeddings answers."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import numpy as np
from openai.types import CreateEmbeddingResponse

from tests.helpers.server import LiveServer
from vectorpress.engine import Engine
from vectorpress.jobs.openai_batch import run_openai_batch
from vectorpress.settings import Settings


def test_batch_file_answers_as_the_server(tmp_path: Path, embedding_folder: Path) -> None:
    requests = [
        {"custom_id": "a", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "m", "input": ["first text", "second, longer text"]}},
        {"custom_id": "b", "method": "POST", "url": "/v1/embeddings",
         "body": {"model": "m", "input": "one text", "encoding_format": "base64", "dimensions": 8}},
        {"custom_id": "c", "method": "POST", "url": "/v1/chat/completions", "body": {}},
        {"custom_id": "d", "method": "POST", "url": "/v1/embeddings", "body": {"input": []}},
        {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {"input": 3.5}},
    ]  # fmt: skip
    src = tmp_path / "batch.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in requests) + "{broken\n")
    out = tmp_path / "out.jsonl"
    settings = Settings.single(str(embedding_folder))
    with Engine(settings=settings.model, threads=1) as engine:
        summary = run_openai_batch(str(src), str(out), engine)
    assert "2 requests answered, 4 failed" in summary
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == ["a", "b", "c", "d", "e", None]
    assert [x["response"]["status_code"] for x in lines] == [200, 200, 400, 400, 422, 400]
    assert all(x["error"] is None and x["id"].startswith("vp-") for x in lines)
    assert "only POST /v1/embeddings" in lines[2]["response"]["body"]["error"]["message"]
    with LiveServer(settings) as srv:
        for request, line in zip(requests[:2], lines[:2], strict=True):
            body = line["response"]["body"]
            if request["body"].get("encoding_format") != "base64":
                CreateEmbeddingResponse.model_validate(body)  # the SDK's own type
            want = httpx.post(f"{srv.url}/v1/embeddings", json=request["body"], timeout=60).json()
            assert body["usage"] == want["usage"] and body["model"] == want["model"]
            for got, ref in zip(body["data"], want["data"], strict=True):
                if isinstance(ref["embedding"], str):
                    got_v = np.frombuffer(base64.b64decode(got["embedding"]), "<f4")
                    ref_v = np.frombuffer(base64.b64decode(ref["embedding"]), "<f4")
                    assert got_v.shape == (8,)
                else:
                    got_v, ref_v = np.asarray(got["embedding"]), np.asarray(ref["embedding"])
                np.testing.assert_allclose(got_v, ref_v, atol=1e-6)
        for line in lines[3:5]:
            error = line["response"]["body"]["error"]
            assert error["message"] and error["code"] == line["response"]["status_code"]
