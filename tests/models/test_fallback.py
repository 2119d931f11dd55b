"""The transformers fallback serves architectures that have no native model, over real HTTP."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch

from tests.helpers.batches import tokenized_batches
from tests.helpers.hf_reference import transformers_embed, transformers_logits, transformers_splade
from tests.helpers.reference import assert_close_vectors
from tests.helpers.server import LiveServer
from tests.helpers.texts import mixed_texts
from vectorpress.backends.hf import backend as hf_backend
from vectorpress.backends.torch.registry import lookup
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import Settings

TEXTS = [*mixed_texts(10, seed=5, long_share=0.3), "a", "Hello world!"]


@pytest.mark.parametrize(("arch", "pooling"), [("electra", "cls"), ("albert", "mean")])
def test_embed_over_http_matches_transformers(
    tiny: Callable[..., Path], arch: str, pooling: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert lookup(arch) is None, f"{arch} now has a native model; pick another for this test"
    folder = tiny(arch, "embedding", pooling)
    want = transformers_embed(folder, TEXTS, pooling)
    with caplog.at_level(logging.INFO, logger="vectorpress.backends.select"):
        server = LiveServer(Settings.single(str(folder)))
        with server:
            assert server.served is not None and server.served.backend.name == "hf"
            response = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS}, timeout=60)
            info = httpx.get(f"{server.url}/info", timeout=10).json()
    assert response.status_code == 200, response.text
    assert_close_vectors(response.json(), want, max_abs=1e-4, what=f"{arch} /embed")
    assert info["model_type"] == {"embedding": {"pooling": pooling}}
    why = [r.getMessage() for r in caplog.records if r.name == "vectorpress.backends.select"]
    assert any("backend hf serves" in m and "no native model" in m for m in why), why


@pytest.mark.parametrize("arch", ["electra", "albert"])
def test_predict_over_http_matches_transformers(tiny: Callable[..., Path], arch: str) -> None:
    folder = tiny(arch, "classifier")
    inputs = [TEXTS[0], TEXTS[3], "Hello world!"]
    want = transformers_logits(folder, inputs, max_length=512)
    labels = ["negative", "neutral", "positive"]
    with LiveServer(Settings.single(str(folder))) as server:
        assert server.served is not None and server.served.backend.name == "hf"
        got = []
        for text in inputs:
            response = httpx.post(
                f"{server.url}/predict",
                json={"inputs": text, "raw_scores": True},
                timeout=60,
            )
            assert response.status_code == 200, response.text
            scores = {p["label"]: p["score"] for p in response.json()}
            got.append([scores[label] for label in labels])
        # A classifier refuses /embed as TEI does, and keeps serving.
        embed = httpx.post(f"{server.url}/embed", json={"inputs": "x"}, timeout=10)
        again = httpx.post(f"{server.url}/predict", json={"inputs": "x"}, timeout=10)
    assert_close_vectors(np.array(got), want, max_abs=1e-4, what=f"{arch} /predict")
    assert embed.status_code == 424, embed.text
    assert again.status_code == 200, again.text


def test_fallback_serves_when_asked_for_a_native_architecture(tiny: Callable[..., Path]) -> None:
    """--backend hf wins over the registry: the escape hatch when a native model misbehaves."""
    folder = tiny("bert", "embedding", "cls")
    with LiveServer(Settings.single(str(folder), backend="hf")) as server:
        assert server.served is not None and server.served.backend.name == "hf"
        response = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS}, timeout=60)
    assert response.status_code == 200
    assert_close_vectors(response.json(), transformers_embed(folder, TEXTS, "cls"), max_abs=1e-4)


def test_native_type_with_rotary_scaling_it_lacks_goes_to_the_fallback(
    tiny: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    """YaRN rotary scaling (long-context Qwen2 checkpoints) has no native tables: the fallback
    serves it, says why, and matches transformers."""
    yarn = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 128,
        "rope_theta": 10000.0,
    }
    folder = tiny("qwen2", "embedding", "last_token", rope_parameters=yarn)
    want = transformers_embed(folder, TEXTS, "last_token")
    with caplog.at_level(logging.INFO, logger="vectorpress.backends.select"):
        server = LiveServer(Settings.single(str(folder)))
        with server:
            assert server.served is not None and server.served.backend.name == "hf"
            response = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS}, timeout=60)
    assert response.status_code == 200, response.text
    assert_close_vectors(response.json(), want, max_abs=1e-4, what="qwen2 yarn")
    why = [r.getMessage() for r in caplog.records if r.name == "vectorpress.backends.select"]
    assert any("'yarn' has no native implementation" in m for m in why), why


def test_decoder_classifier_without_pad_token_is_scored_one_by_one(
    tiny: Callable[..., Path],
) -> None:
    """transformers cannot batch a decoder classifier that has no pad id; the fallback caps its
    batches at one input rather than failing the request."""
    folder = tiny("qwen2", "reranker", pad_token_id=None)
    inputs = [TEXTS[0], ("what is a magnet?", TEXTS[2]), "Hello world!", TEXTS[4]]
    want = transformers_logits(folder, inputs, max_length=512)
    with LiveServer(Settings.single(str(folder), backend="hf")) as server:
        assert server.served is not None and server.served.backend.max_batch_size == 1
        response = httpx.post(
            f"{server.url}/predict",
            json={
                "inputs": [[t] if isinstance(t, str) else list(t) for t in inputs],
                "raw_scores": True,
            },
            timeout=60,
        )
    assert response.status_code == 200, response.text
    got = [[p["score"] for p in row] for row in response.json()]
    assert_close_vectors(np.array(got), want, max_abs=1e-4, what="qwen2 reranker without pad")


@pytest.mark.parametrize(("arch", "backend"), [("electra", "hf"), ("qwen3", "torch")])
def test_bfloat16_is_honoured_and_close_to_float32(
    tiny: Callable[..., Path], arch: str, backend: str
) -> None:
    pooling = "last_token" if arch == "qwen3" else "cls"
    folder = tiny(arch, "embedding", pooling)
    want = transformers_embed(folder, TEXTS, pooling)
    with LiveServer(Settings.single(str(folder), dtype="bfloat16")) as server:
        assert server.served is not None
        assert (server.served.backend.name, server.served.backend.dtype) == (backend, "bfloat16")
        model = server.served.backend.model  # type: ignore[attr-defined]
        assert next(model.parameters()).dtype == torch.bfloat16
        response = httpx.post(f"{server.url}/embed", json={"inputs": TEXTS}, timeout=60)
    assert response.status_code == 200, response.text
    # bfloat16 keeps 8 bits of mantissa: close, not equal.
    assert_close_vectors(response.json(), want, min_cos=0.99, what=f"{arch} bfloat16")


def test_the_fallback_runs_length_buckets_of_bounded_size(
    tiny: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each batch runs as length buckets padded within themselves, of at most PASS_TOKENS padded
    tokens (a SPLADE batch's logits are tokens x vocabulary), and gives every text the
    transformers reference's vector wherever it lands."""
    monkeypatch.setattr(hf_backend, "PASS_TOKENS", 96)
    texts = [*TEXTS, "x " * 300]
    shapes: list[tuple[int, ...]] = []
    for task, pooling in (("embedding", "mean"), ("mlm", "splade")):
        folder = tiny("electra", task, "mean")
        settings = Settings.single(str(folder), pooling=pooling, backend="hf")
        backend = hf_backend.HFBackend(load_model_spec(folder, settings.model))
        model = backend.model

        def watched(model: Any = model, **inputs: torch.Tensor) -> Any:
            shapes.append(tuple(inputs["input_ids"].shape))
            return model(**inputs)

        backend.model = watched  # type: ignore[assignment]
        (batch,) = tokenized_batches(folder, texts, len(texts), max_length=128)
        got = backend.embed(batch).pooled
        if task == "mlm":
            want = transformers_splade(folder, texts, max_length=128)
        else:
            want = transformers_embed(folder, texts, "mean", normalize=False)
        assert_close_vectors(got, want, max_abs=1e-4, what=f"electra {task} in buckets")
        assert len(shapes) > 2
        assert all(rows * width <= 96 or rows == 1 for rows, width in shapes), shapes
        shapes.clear()
