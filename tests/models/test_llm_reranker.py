"""Causal-LM rerankers (the Qwen3-Reranker recipe) on the native decoders, against the model
card's formula run on transformers' AutoModelForCausalLM (tests/helpers/llm_reference.py)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.checkpoints import make_llm_reranker
from tests.helpers.llm_reference import llm_rerank_scores
from tests.helpers.process import run_to_exit
from tests.helpers.server import LiveServer
from vectorpress.errors import StartupError
from vectorpress.settings import ModelSettings, Settings

QUERY = "what is the capital of china?"
DOCUMENTS = [
    "The capital of China is Beijing.",
    "Gravity is a force that attracts two bodies towards each other. It gives weight to "
    "physical objects and is responsible for the movement of planets around the sun.",
    "no",
    "Beijing {document} is {query} the capital",
    "word " * 700,
]
ARCHS = ("qwen3", "qwen2", "llama", "mistral", "gemma3_text")


def post(server: LiveServer, path: str, payload: Any) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=payload, timeout=60)


def check_rerank(srv: LiveServer, want: list[float]) -> None:
    r = post(srv, "/rerank", {"query": QUERY, "texts": DOCUMENTS})
    assert r.status_code == 200, r.text
    hits = r.json()
    got = {hit["index"]: hit["score"] for hit in hits}
    for i, score in enumerate(want):
        assert abs(got[i] - score) <= 1e-4, f"document {i}: {got[i]} != {score}"
    assert [h["index"] for h in hits] == sorted(range(len(want)), key=lambda i: -want[i])


@pytest.mark.parametrize(
    ("arch", "config"), [(a, {}) for a in ARCHS] + [("llama", {"tie_word_embeddings": True})]
)
def test_scores_match_the_model_card(tmp_path: Path, arch: str, config: dict[str, Any]) -> None:
    folder = make_llm_reranker(tmp_path / f"tiny-{arch}-reranker", arch, **config)
    pairs = [(QUERY, d) for d in DOCUMENTS]
    # The checkpoint's 512 positions bound the server's prompts, and so the reference's.
    want = llm_rerank_scores(folder, pairs, max_length=512)
    with LiveServer(Settings.single(str(folder))) as srv:
        check_rerank(srv, want)
        r = post(srv, "/predict", {"inputs": [[QUERY, DOCUMENTS[0]], [QUERY, DOCUMENTS[2]]]})
        assert r.status_code == 200, r.text
        assert abs(r.json()[0][0]["score"] - want[0]) <= 1e-4
        assert abs(r.json()[1][0]["score"] - want[2]) <= 1e-4
        # Raw: the logit difference, log(p / (1 - p)).
        r = post(srv, "/rerank", {"query": QUERY, "texts": DOCUMENTS[:1], "raw_scores": True})
        assert abs(r.json()[0]["score"] - math.log(want[0] / (1 - want[0]))) <= 1e-3
        info = httpx.get(f"{srv.url}/info").json()
        assert "reranker" in info["model_type"]


def test_a_template_and_one_answer_token(tmp_path: Path) -> None:
    """bge-reranker-v2-gemma's kind of recipe: its own prompt, and the sigmoid of one token's
    logit; and the setting serves a causal LM whose name does not say reranker."""
    folder = make_llm_reranker(tmp_path / "tiny-causal", "gemma3_text")
    prefix, suffix = "A: ", "\nPredict whether passage B contains an answer to query A."
    template = "{query}\nB: {document}"
    settings = Settings.single(
        str(folder),
        llm_reranker=True,
        reranker_prefix=prefix,
        reranker_template=template,
        reranker_suffix=suffix,
        reranker_tokens="yes",
    )
    pairs = [(QUERY, d) for d in DOCUMENTS]
    want = llm_rerank_scores(
        folder,
        pairs,
        prefix=prefix,
        suffix=suffix,
        tokens=("yes",),
        max_length=512,
        template=template,
    )
    with LiveServer(settings) as srv:
        check_rerank(srv, want)


def test_bad_set_ups_and_inputs(tmp_path: Path) -> None:
    with pytest.raises(StartupError, match="must contain"):
        ModelSettings("x", reranker_template="{query} only")
    with pytest.raises(StartupError, match="reranker-tokens"):
        ModelSettings("x", reranker_tokens="a,b,c")
    folder = make_llm_reranker(tmp_path / "tiny-reranker", "qwen3")
    for settings, message in (
        (Settings.single(str(folder), reranker_tokens="zzzqqq"), "not in the vocabulary"),
        (Settings.single(str(folder), backend="hf"), "--backend torch"),
    ):
        with pytest.raises(StartupError, match=message), LiveServer(settings):
            pass
    with LiveServer(Settings.single(str(folder))) as srv:
        r = post(srv, "/predict", {"inputs": "one text"})
        assert r.status_code == 422, r.text
        assert post(srv, "/embed", {"inputs": "a"}).status_code == 424
        assert post(srv, "/embed_multi", {"inputs": "a"}).status_code == 424
        # A prompt is not windowed: asking for it is a clear 422.
        r = post(srv, "/rerank", {"query": "q", "texts": ["a"], "windowed": True})
        assert r.status_code == 422 and "LLM reranker" in r.json()["error"], r.text
        r = post(srv, "/v1/rerank", {"query": "q", "documents": ["a"], "max_chunks_per_doc": 3})
        assert r.status_code == 422, r.text
        assert post(srv, "/rerank", {"query": "q", "texts": ["a"]}).status_code == 200


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--reranker-template", "{query} only"], "--reranker-template must contain"),
        (["--windowed-inputs"], "--windowed-inputs does not apply to an LLM reranker"),
    ],
)
def test_a_bad_set_up_is_one_start_up_line(tmp_path: Path, flags: list[str], message: str) -> None:
    folder = make_llm_reranker(tmp_path / "tiny-reranker", "qwen3")
    done = run_to_exit(
        ["--model-id", str(folder), *flags], env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert done.returncode == 1, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and message in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr
