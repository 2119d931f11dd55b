"""The `tei-client` package's gRPC client, unmodified, against vectorpress."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.grpc.clients import Stubs
from tests.helpers.reference import assert_close_vectors
from tests.helpers.server import LiveServer
from vectorpress.api.grpc.stubs import pb

Server = tuple[LiveServer, Stubs]
ROOT = Path(__file__).resolve().parents[2]

TEXTS = [
    "Open the file and iterate over it; each iteration yields one line.",
    "The weather in Paris is mild in spring.",
    "Use readline() in a loop until it returns an empty string.",
    "Stock markets fell sharply on Monday.",
]
QUERY = "How do I read a file line by line?"


def test_tei_client_embeds_reranks_and_classifies(
    minilm_grpc: Server, reranker_grpc: Server, classifier_grpc: Server
) -> None:
    job = {
        "embed": minilm_grpc[0].grpc_target,
        "rerank": reranker_grpc[0].grpc_target,
        "classify": classifier_grpc[0].grpc_target,
        "texts": TEXTS,
        "query": QUERY,
    }
    # Its own process: a client with its own compiled copy of TEI's proto, as users run it.
    done = subprocess.run(
        [sys.executable, "-m", "tests.grpc.run_tei_client"],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)

    assert got["info_model_type"] == "embedding"
    http = httpx.post(
        f"{minilm_grpc[0].url}/embed", json={"inputs": TEXTS, "truncate": False}, timeout=60
    )
    assert http.status_code == 200, http.text
    assert_close_vectors(got["embed"], http.json(), min_cos=0.99999, max_abs=1e-6, what="tei")
    tokenizer = minilm_grpc[0].infer.tokenizers._new_tokenizer()
    assert got["tokens"] == [tokenizer.encode(t).ids for t in TEXTS[:2]]

    rerank = reranker_grpc[1].rerank.Rerank(pb.RerankRequest(query=QUERY, texts=TEXTS))
    assert [r["index"] for r in got["rerank"]] == [r.index for r in rerank.ranks]
    assert [r["score"] for r in got["rerank"]] == pytest.approx(
        [r.score for r in rerank.ranks], abs=1e-6
    )
    assert [r["text"] for r in got["rerank"]] == [TEXTS[r.index] for r in rerank.ranks]

    predict = classifier_grpc[1].predict
    for text, scores in zip(TEXTS, got["classify"], strict=True):
        want = predict.Predict(pb.PredictRequest(inputs=text)).predictions
        assert [s[0] for s in scores] == [p.label for p in want]
        assert [s[1] for s in scores] == pytest.approx([p.score for p in want], abs=1e-6)
    for text, scores in zip(TEXTS, got["classify_pairs"], strict=True):
        want = predict.PredictPair(pb.PredictPairRequest(inputs=[QUERY, text])).predictions
        assert [s[0] for s in scores] == [p.label for p in want]
        assert [s[1] for s in scores] == pytest.approx([p.score for p in want], abs=1e-6)
