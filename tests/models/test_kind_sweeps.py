"""The zoo's sweeps over `--backend onnx` and `--dtype bfloat16`, for the model kinds beyond the
architectures (bge-m3, ColBERT, LLM rerankers) and for windowed inputs.

Each case is checked against its own reference library on the same tiny folder (FlagEmbedding,
PyLate, the model card's formula on transformers, sentence-transformers window by window), at
the sweeps' bounds: ONNX within 1e-4 as test_onnx_zoo.py, bfloat16 within cosine 0.99 of the
float32 reference as test_fallback.py, its scores within test_cuda.py's 2e-2. The transformers
fallback runs none of these kinds' heads, and ONNX cannot serve a ColBERT query expanded past
its encoder's local window alike: each refuses at start-up with one line.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.helpers.checkpoints import make_colbert, make_llm_reranker, make_m3
from tests.helpers.llm_reference import llm_rerank_scores
from tests.helpers.process import clean_env, run_to_exit
from tests.helpers.reference import assert_close_vectors
from tests.helpers.refvenv import run_reference
from tests.helpers.server import LiveServer
from tests.helpers.texts import mixed_texts
from tests.models.test_registry import MODEL_KINDS
from tests.models.test_windows import pair_windows
from tests.models.test_windows import reference as windowed_reference
from vectorpress.settings import Settings

QUERY = "what is late interaction?"
TEXTS = [
    "ColBERT encodes queries and documents into per-token vectors; MaxSim sums the best match.",
    "the cat sat on the mat!!",
    "BM25 ranks documents by the query terms appearing in each one",
    "a",
]
#: The sweeps' bounds (see the module docstring).
ONNX_ABS = 1e-4
BF16_COS, BF16_SCORE = 0.99, 2e-2
BF16_RELATIVE = 5e-2  # bge-m3's combined score: see check_m3
MODES = ("onnx", "bfloat16")


def post(url: str, path: str, body: dict[str, Any]) -> Any:
    r = httpx.post(f"{url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def close_vectors(got: Any, want: Any, mode: str, what: str) -> None:
    if mode == "onnx":
        assert_close_vectors(got, want, max_abs=ONNX_ABS, what=f"{what} onnx")
    else:
        assert_close_vectors(got, want, min_cos=BF16_COS, what=f"{what} bf16")


def close_scores(
    got: list[float], want: list[float], mode: str, what: str, relative: bool = False
) -> None:
    """Within the mode's bound (`relative`: of each score's size) and, for ONNX (and for
    bf16 on a relative bound: scores of that size are far apart), in the same order."""
    bound = ONNX_ABS if mode == "onnx" else BF16_RELATIVE if relative else BF16_SCORE
    for g, w in zip(got, want, strict=True):
        scale = max(abs(w), 1.0) if relative else 1.0
        assert abs(g - w) <= bound * scale, f"{what} {mode}: scores {got} against {want}"
    if mode == "onnx" or relative:
        assert np.argsort(got).tolist() == np.argsort(want).tolist(), what


def ranked(hits: list[dict[str, Any]]) -> list[float]:
    return [s for _, s in sorted((h["index"], h["score"]) for h in hits)]


def check_m3(url: str, mode: str, want: dict[str, Any]) -> None:
    items = post(url, "/embed_multi", {"inputs": TEXTS, "dense": True, "sparse": True})
    close_vectors([i["dense"] for i in items], want["dense"], mode, "m3 dense")
    for n, (item, vectors) in enumerate(zip(items, want["colbert"], strict=True)):
        assert len(item["colbert"]) == len(vectors), f"m3 colbert[{n}]: token count"
        close_vectors(item["colbert"], vectors, mode, f"m3 colbert[{n}]")
    for n, (item, weights) in enumerate(zip(items, want["sparse"], strict=True)):
        got = {str(p["index"]): p["value"] for p in item["sparse"]}
        if mode == "onnx":
            assert got.keys() == weights.keys(), f"m3 sparse[{n}]: token ids"
        ids = sorted(got.keys() | weights.keys())
        close_vectors(
            [[got.get(i, 0.0) for i in ids]], [[weights.get(i, 0.0) for i in ids]], mode, "sparse"
        )
    hits = post(url, "/rerank", {"query": TEXTS[0], "texts": TEXTS[1:]})
    # The sparse term is a dot product of unnormalized lexical weights (scores of 0.5 to 5
    # here), so its bound is relative.
    combined = [s["colbert+sparse+dense"] for s in want["scores"]]
    close_scores(ranked(hits), combined, mode, "m3", relative=True)


def check_colbert(url: str, mode: str, want: dict[str, Any]) -> None:
    for side, texts in (("queries", [QUERY, "a"]), ("documents", TEXTS)):
        items = post(url, "/embed_multi", {"inputs": texts, "is_query": side == "queries"})
        for n, (item, vectors) in enumerate(zip(items, want[side], strict=True)):
            assert len(item["colbert"]) == len(vectors), f"colbert {side}[{n}]: token count"
            close_vectors(item["colbert"], vectors, mode, f"colbert {side}[{n}]")
    hits = post(url, "/rerank", {"query": QUERY, "texts": TEXTS})
    # MaxSim sums a query's tokens' cosines: bf16's bound holds for each of them.
    scale = 1 if mode == "onnx" else len(want["queries"][0])
    got, expected = ranked(hits), want["scores"][0]
    close_scores([g / scale for g in got], [w / scale for w in expected], mode, "colbert")


def check_llm(url: str, mode: str, want: list[float]) -> None:
    hits = post(url, "/rerank", {"query": QUERY, "texts": TEXTS})
    close_scores(ranked(hits), want, mode, "llm reranker")


LONG = [" ".join(mixed_texts(12, seed=s)) for s in (1, 2)] + ["a short one"]
LONG_QUERY = "how do I open a file and read its lines?"


def check_windows(url: str, mode: str, want: list[np.ndarray]) -> None:
    got = post(url, "/embed", {"inputs": LONG, "windowed": True, "window_overlap": 16})
    close_vectors(got, want, mode, "windowed")


def check_rerank_windows(url: str, mode: str, want: list[float]) -> None:
    body = {"query": LONG_QUERY, "texts": LONG, "windowed": True, "window_overlap": 32}
    close_scores(ranked(post(url, "/rerank", body)), want, mode, "windowed rerank")


@dataclass(frozen=True)
class Case:
    kind: str
    """A MODEL_KINDS name of test_registry.py, or `windowed`."""
    build: Callable[[Path, Callable[..., Path]], Path]
    reference: Callable[[Path], Any]
    check: Callable[[str, str, Any], None]


def _m3_reference(folder: Path) -> Any:
    pairs = [[TEXTS[0], t] for t in TEXTS[1:]]
    return run_reference("m3", {"folder": str(folder), "texts": TEXTS, "pairs": pairs})


def _colbert_reference(folder: Path) -> Any:
    request = {"folder": str(folder), "queries": [QUERY, "a"], "documents": TEXTS}
    return run_reference("colbert", request)


def _rerank_windows_reference(folder: Path) -> list[float]:
    import torch
    from sentence_transformers import CrossEncoder

    model = CrossEncoder(str(folder), device="cpu")
    out = []
    for text in LONG:
        scores = []
        for ids in pair_windows(folder, LONG_QUERY, text, 32, 512):
            with torch.inference_mode():
                logit = model.model(input_ids=torch.tensor([ids])).logits[0, 0]
            scores.append(float(torch.sigmoid(logit)))
        out.append(max(scores))
    return out


CASES = {
    "bge-m3": Case("bge-m3", lambda d, _: make_m3(d / "m3"), _m3_reference, check_m3),
    # ModernBERT: global and local attention layers, both with the held-out expansion in their
    # masks; every expansion token within half of the 16-token local window of a real one
    # (test_colbert.py has queries that reach past it, on the native backend).
    "colbert-modernbert": Case(
        "colbert",
        lambda d, _: make_colbert(
            d / "modernbert", "modernbert", query_length=10, document_length=40
        ),
        _colbert_reference,
        check_colbert,
    ),
    "llm-reranker-qwen3": Case(
        "llm-reranker",
        lambda d, _: make_llm_reranker(d / "tiny-qwen3-reranker", "qwen3"),
        lambda f: llm_rerank_scores(f, [(QUERY, t) for t in TEXTS], max_length=512),
        check_llm,
    ),
    "llm-reranker-gemma3": Case(
        "llm-reranker",
        lambda d, _: make_llm_reranker(d / "tiny-gemma3-reranker", "gemma3_text"),
        lambda f: llm_rerank_scores(f, [(QUERY, t) for t in TEXTS], max_length=512),
        check_llm,
    ),
    "windowed-embed": Case(
        "windowed",
        lambda _, tiny: tiny("bert", "embedding", "mean"),
        lambda f: windowed_reference(f, LONG, 16),
        check_windows,
    ),
    "windowed-rerank": Case(
        "windowed",
        lambda _, tiny: tiny("modernbert", "reranker", initializer_range=0.3),
        _rerank_windows_reference,
        check_rerank_windows,
    ),
}


def test_every_model_kind_is_in_the_sweeps() -> None:
    assert set(MODEL_KINDS) <= {case.kind for case in CASES.values()}, sorted(MODEL_KINDS)


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory, tiny: Callable[..., Path]
) -> Callable[[str], tuple[Path, Any]]:
    """A case's folder and its reference answers, made once per module."""
    made: dict[str, tuple[Path, Any]] = {}

    def build(name: str) -> tuple[Path, Any]:
        if name not in made:
            folder = CASES[name].build(tmp_path_factory.mktemp(name), tiny)
            made[name] = folder, CASES[name].reference(folder)
        return made[name]

    return build


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CASES))
def test_the_kind_matches_its_reference(
    built: Callable[[str], tuple[Path, Any]], name: str, mode: str, tmp_path: Path
) -> None:
    folder, want = built(name)
    options: dict[str, Any] = (
        {"backend": "onnx", "huggingface_hub_cache": str(tmp_path)}
        if mode == "onnx"
        else {"dtype": "bfloat16"}
    )
    with LiveServer(Settings.single(str(folder), **options)) as srv:
        assert srv.served is not None
        backend = srv.served.backend
        assert (backend.name, backend.dtype) == (
            ("onnx", "float32") if mode == "onnx" else ("torch", "bfloat16")
        )
        CASES[name].check(srv.url, mode, want)


@pytest.mark.parametrize("name", ["bge-m3", "colbert-modernbert", "llm-reranker-qwen3"])
def test_the_transformers_fallback_refuses_the_kind_in_one_line(
    built: Callable[[str], tuple[Path, Any]], name: str
) -> None:
    folder, _ = built(name)
    run = run_to_exit(["--model-id", str(folder), "--backend", "hf"], env=clean_env())
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    (line,) = [s for s in run.stderr.splitlines() if s.startswith("vectorpress: error:")]
    assert "or onnx, not hf" in line, line


def test_onnx_refuses_a_query_expanded_past_the_local_window(
    built: Callable[[str], tuple[Path, Any]], tmp_path: Path
) -> None:
    folder = tmp_path / "modernbert"
    shutil.copytree(built("colbert-modernbert")[0], folder)
    settings = json.loads((folder / "config_sentence_transformers.json").read_text())
    settings["query_length"] = 20  # past half the local window (8) of a 3-token query
    (folder / "config_sentence_transformers.json").write_text(json.dumps(settings))
    run = run_to_exit(["--model-id", str(folder), "--backend", "onnx"], env=clean_env())
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    (line,) = [s for s in run.stderr.splitlines() if s.startswith("vectorpress: error:")]
    assert "local attention window" in line and "--backend torch" in line, line
