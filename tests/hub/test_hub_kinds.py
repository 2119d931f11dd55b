"""bge-m3, ColBERT (PyLate's layout), an LLM reranker and a `--dense-path` pick downloaded from a
local server speaking the Hub's protocol: each repository also holds files serving has no use
for, the download takes exactly the files the kind reads, and the server answers as the same
folder served locally, and again offline from the cache.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers.checkpoints import make_colbert, make_llm_reranker, make_m3, make_tiny
from tests.helpers.fake_hub import FakeHub
from tests.helpers.kernels import warm_kernels
from tests.helpers.process import ServerProcess, clean_env
from tests.helpers.reference import assert_close_vectors
from tests.helpers.server import LiveServer
from tests.models.test_registry import MODEL_KINDS
from vectorpress.settings import Settings

QUERY = "what is late interaction?"
TEXTS = [
    "ColBERT encodes queries and documents into per-token vectors.",
    "the cat sat on the mat!!",
    "BM25 ranks documents by the query terms appearing in each one",
]
#: What serving reads of every kind: the encoder's config, weights and tokenizer.
COMMON = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
CHAT_TEMPLATE = "{% for message in messages %}<|im_start|>{{ message['content'] }}{% endfor %}"


def _decoys(folder: Path) -> None:
    """Files a real repository carries that no kind reads."""
    (folder / "README.md").write_text("# a tiny model\n")
    (folder / "pytorch_model.bin").write_bytes(b"pickled weights beside the safetensors")
    (folder / "onnx").mkdir()
    (folder / "onnx" / "model.onnx").write_bytes(b"a graph serving does not run")
    (folder / "imgs").mkdir()
    (folder / "imgs" / "results.png").write_bytes(b"\x89PNG a picture of the results")


def _m3(dest: Path) -> Path:
    folder = make_m3(dest / "tiny-m3")
    _decoys(folder)
    return folder


def _colbert(dest: Path) -> Path:
    """The projection saved as a PyTorch pickle only, as older PyLate checkpoints are: the
    download falls back to pickles for that folder alone."""
    folder = make_colbert(dest / "tiny-colbert", query_length=12, document_length=24)
    dense = folder / "1_Dense"
    torch.save(load_file(dense / "model.safetensors"), dense / "pytorch_model.bin")
    (dense / "model.safetensors").unlink()
    _decoys(folder)
    return folder


def _llm(dest: Path) -> Path:
    folder = make_llm_reranker(dest / "tiny-qwen3-reranker")
    (folder / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    _decoys(folder)
    return folder


IDENTITY = "torch.nn.modules.linear.Identity"


def _stella(dest: Path) -> Path:
    """Stella's layout: modules.json lists 2_Dense; 2_Dense_6 beside it is the one asked for."""
    folder = make_tiny(dest / "tiny-stella", "bert", dense=[(32, 8, IDENTITY)])
    shutil.copytree(folder / "2_Dense", folder / "2_Dense_6")
    (folder / "2_Dense_6" / "config.json").write_text(
        json.dumps(
            {"in_features": 32, "out_features": 6, "bias": False, "activation_function": IDENTITY}
        )
    )
    gen = torch.Generator().manual_seed(6)
    save_file(
        {"linear.weight": torch.randn(6, 32, generator=gen)},
        str(folder / "2_Dense_6" / "model.safetensors"),
    )
    _decoys(folder)
    return folder


def _embed_answers(url: str) -> dict[str, Any]:
    r = httpx.post(f"{url}/embed", json={"inputs": TEXTS}, timeout=60)
    assert r.status_code == 200, r.text
    assert np.array(r.json()).shape == (len(TEXTS), 6)
    return {"embed": r.json()}


def _m3_answers(url: str) -> dict[str, Any]:
    multi = httpx.post(
        f"{url}/embed_multi",
        json={"inputs": TEXTS, "dense": True, "sparse": True, "colbert": True},
        timeout=60,
    )
    rerank = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": TEXTS}, timeout=60)
    assert multi.status_code == rerank.status_code == 200, multi.text + rerank.text
    return {"multi": multi.json(), "rerank": rerank.json()}


def _colbert_answers(url: str) -> dict[str, Any]:
    out = {}
    for side, inputs in (("query", [QUERY]), ("document", TEXTS)):
        r = httpx.post(
            f"{url}/embed_multi", json={"inputs": inputs, "is_query": side == "query"}, timeout=60
        )
        assert r.status_code == 200, r.text
        out[side] = r.json()
    rerank = httpx.post(f"{url}/rerank", json={"query": QUERY, "texts": TEXTS}, timeout=60)
    assert rerank.status_code == 200, rerank.text
    out["rerank"] = rerank.json()
    return out


def _llm_answers(url: str) -> dict[str, Any]:
    body = {"query": QUERY, "texts": TEXTS, "raw_scores": True}
    r = httpx.post(f"{url}/rerank", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return {"rerank": r.json()}


@dataclass(frozen=True)
class Kind:
    repo: str
    build: Callable[[Path], Path]
    answers: Callable[[str], dict[str, Any]]
    fetched: frozenset[str]
    """Exactly the files the download must take."""
    settings: tuple[tuple[str, str], ...] = ()


KINDS = {
    "bge-m3": Kind(
        "vp-test/tiny-m3",
        _m3,
        _m3_answers,
        frozenset(
            COMMON
            | {"special_tokens_map.json", "modules.json", "sentence_bert_config.json"}
            | {"1_Pooling/config.json", "colbert_linear.pt", "sparse_linear.pt"}
        ),
    ),
    "colbert": Kind(
        "vp-test/tiny-colbert",
        _colbert,
        _colbert_answers,
        frozenset(
            COMMON
            | {"modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"}
            | {"1_Dense/config.json", "1_Dense/pytorch_model.bin"}
        ),
    ),
    "llm-reranker": Kind(
        "vp-test/tiny-qwen3-reranker",
        _llm,
        _llm_answers,
        frozenset(COMMON | {"special_tokens_map.json", "chat_template.jinja"}),
    ),
    "dense-path": Kind(
        "vp-test/tiny-stella",
        _stella,
        _embed_answers,
        frozenset(
            COMMON
            | {"special_tokens_map.json", "modules.json", "sentence_bert_config.json"}
            | {"1_Pooling/config.json", "2_Dense_6/config.json", "2_Dense_6/model.safetensors"}
        ),
        settings=(("dense_path", "2_Dense_6"),),
    ),
}


def test_every_model_kind_has_a_download_case() -> None:
    # A kind that a setting makes of a plain checkpoint (windowed inputs) reads no file of its own.
    kinds = {name for name, kind in MODEL_KINDS.items() if not kind.settings}
    assert kinds <= set(KINDS), sorted(kinds - set(KINDS))


@pytest.fixture(scope="module", params=sorted(KINDS))
def published(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Kind, Path, dict[str, Any]]]:
    """A kind's folder, and the answers of the folder served locally."""
    kind = KINDS[request.param]
    folder = kind.build(tmp_path_factory.mktemp(request.param))
    with LiveServer(Settings.single(str(folder), **dict(kind.settings))) as srv:
        yield kind, folder, kind.answers(srv.url)


def _close(got: Any, want: Any, where: str = "") -> None:
    """Equal structure; numbers within float32 noise (two processes, same weights)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), where
        for key in want:
            _close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list) and want and all(isinstance(v, float) for v in want):
        assert_close_vectors([got], [want], max_abs=1e-5, what=where)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _close(g, w, f"{where}[{i}]")
    elif isinstance(want, float):
        assert abs(got - want) <= 1e-5, where
    else:
        assert got == want, where


def test_the_download_takes_what_the_kind_reads_and_serves_it(
    published: tuple[Kind, Path, dict[str, Any]], tmp_path: Path
) -> None:
    kind, folder, want = published
    hub = FakeHub()
    hub.add_commit(kind.repo, folder)
    cache = tmp_path / "cache"
    warm_kernels(cache)  # the compiled kernel, as a kept cache volume holds it
    with hub.serving():
        env = clean_env(
            HF_ENDPOINT=hub.endpoint,
            HF_HOME=str(tmp_path / "hf-home"),
            HF_HUB_DISABLE_TELEMETRY="1",
            HF_HUB_DISABLE_PROGRESS_BARS="1",
        )
        args = ["--model-id", kind.repo, "--huggingface-hub-cache", str(cache)]
        for name, value in kind.settings:
            args += [f"--{name.replace('_', '-')}", value]
        with ServerProcess(args, env=env, logs=tmp_path) as srv:
            got = kind.answers(srv.url)
        fetched = hub.downloads()
        # Offline, the cached files serve as they are, without a request.
        hub.seen.clear()
        with ServerProcess(args, env={**env, "HF_HUB_OFFLINE": "1"}, logs=tmp_path) as srv:
            offline = kind.answers(srv.url)
        assert hub.seen == []
    _close(got, want)
    _close(offline, want)
    assert len(fetched) == len(set(fetched)), f"a file fetched twice: {sorted(fetched)}"
    assert set(fetched) == kind.fetched, (
        f"fetched {sorted(set(fetched) - kind.fetched)} more and "
        f"{sorted(kind.fetched - set(fetched))} less than {kind.repo} needs"
    )
    snapshot = next((cache / f"models--{kind.repo.replace('/', '--')}" / "snapshots").iterdir())
    assert {str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file()} == set(
        kind.fetched
    )
