"""The native zoo against transformers and sentence-transformers, and against itself.

For every native architecture a tiny random checkpoint is built from its transformers config
class. Its vectors (and logits) must match the reference on the same folder; the packed native
backend must match the padded transformers fallback; an input alone must match the same input
in a mixed batch.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.helpers.hf_reference import transformers_embed, transformers_logits
from tests.helpers.reference import assert_close_vectors, st_encode
from tests.helpers.texts import mixed_texts
from tests.models.test_bert_family import ARCHS as BERT_FAMILY
from vectorpress.backends.torch.registry import REGISTRY
from vectorpress.server import Served, load
from vectorpress.settings import Settings

#: Every example the registry names, beyond the BERT family (test_bert_family.py has those):
#: a new registry line is checked here as soon as it names its example.
NATIVE = tuple(sorted({e for arch in REGISTRY.values() for e in arch.examples} - set(BERT_FAMILY)))
DECODERS = ("qwen2", "qwen3", "mistral", "llama")

# Long texts are truncated at 128 tokens, well past the tiny checkpoints' 16-token windows.
TEXTS = [*mixed_texts(14, seed=11, long_share=0.3), "a", "Hello world!", "x " * 300]
PAIRS: list[str | tuple[str, str]] = [
    ("what is the capital of france?", "Paris is the capital and largest city of France."),
    ("how do magnets work", TEXTS[0]),
    TEXTS[1],
    ("short", TEXTS[2]),
]


@contextmanager
def served(folder: Path, **settings: Any) -> Iterator[Served]:
    s = load(Settings.single(str(folder), **settings))
    try:
        yield s
    finally:
        s.close()


def embed(s: Served, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
    async def run() -> list[np.ndarray]:
        out: list[np.ndarray] = []
        for i in range(0, len(texts), 32):
            result = await s.infer.embed(list(texts[i : i + 32]), normalize=normalize)
            out.extend(result.values)
        return out

    return np.stack(asyncio.run(run()))


def embed_each(s: Served, texts: Sequence[str]) -> np.ndarray:
    async def run() -> list[np.ndarray]:
        return [(await s.infer.embed([t])).values[0] for t in texts]

    return np.stack(asyncio.run(run()))


def embed_all(s: Served, texts: Sequence[str]) -> list[np.ndarray]:
    async def run() -> list[np.ndarray]:
        return (await s.infer.embed_all(list(texts))).values

    return asyncio.run(run())


def logits(s: Served, inputs: Sequence[str | tuple[str, str]]) -> np.ndarray:
    """Raw scores of Infer.predict, back in label-id order."""

    async def run() -> Any:
        return await s.infer.predict(list(inputs), raw_scores=True)

    result = asyncio.run(run())
    order = s.spec.label2id
    rows = []
    for labelled in result.values:
        row = np.zeros(len(order), dtype=np.float64)
        for label, score in labelled:
            row[order[label]] = score
        rows.append(row)
    return np.stack(rows)


def _pooling(arch: str) -> str:
    return "last_token" if arch in DECODERS else "mean"


@pytest.mark.parametrize("arch", NATIVE)
def test_native_matches_transformers_and_the_padded_fallback(
    tiny: Callable[..., Path], arch: str
) -> None:
    pooling = _pooling(arch)
    folder = tiny(arch, "embedding", pooling)
    want = transformers_embed(folder, TEXTS, pooling)
    with served(folder, backend="torch") as native:
        assert native.backend.name == "torch"
        packed = embed(native, TEXTS)
        alone = embed_each(native, TEXTS[:4] + TEXTS[-3:])
        tokens = embed_all(native, TEXTS[:3])
    with served(folder, backend="hf") as fallback:
        assert fallback.backend.name == "hf"
        padded = embed(fallback, TEXTS)
        padded_tokens = embed_all(fallback, TEXTS[:3])
    for i, (got_t, want_t) in enumerate(zip(tokens, padded_tokens, strict=True)):
        assert got_t.shape == want_t.shape, f"{arch} embed_all[{i}]"
        assert_close_vectors(got_t, want_t, max_abs=1e-4, what=f"{arch} embed_all[{i}] tokens")
    assert_close_vectors(packed, want, max_abs=1e-4, what=f"{arch} native vs transformers")
    assert_close_vectors(padded, want, max_abs=1e-4, what=f"{arch} fallback vs transformers")
    assert_close_vectors(packed, padded, max_abs=1e-4, what=f"{arch} packed vs padded")
    in_batch = np.concatenate([packed[:4], packed[-3:]])
    assert_close_vectors(alone, in_batch, max_abs=1e-5, what=f"{arch} alone vs in a batch")


# qwen2 is left out: transformers maps its model type to its own tokenizer class, which reads
# the borrowed WordPiece tokenizer.json differently (transformers_embed covers it above).
@pytest.mark.parametrize("arch", [a for a in NATIVE if a != "qwen2"])
def test_native_matches_sentence_transformers(tiny: Callable[..., Path], arch: str) -> None:
    pooling = _pooling(arch)
    folder = tiny(arch, "embedding", pooling)
    want = st_encode(folder, TEXTS)
    with served(folder) as native:
        assert native.backend.name == "torch"
        got = embed(native, TEXTS)
    assert_close_vectors(got, want, max_abs=1e-4, what=f"{arch} vs sentence-transformers")


def test_qwen3_instruction_prompt_matches_sentence_transformers(
    tiny: Callable[..., Path],
) -> None:
    """Qwen3-Embedding's layout: an instruction prompt on queries, none on documents."""
    folder = tiny("qwen3", "embedding", "last_token", seed=1)  # its own folder: files change
    prompts = {
        "query": "Instruct: Given a web search query, retrieve relevant passages\nQuery:",
        "document": "",
    }
    (folder / "config_sentence_transformers.json").write_text(
        json.dumps({"prompts": prompts, "default_prompt_name": None})
    )
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    queries = ["what is the capital of france?", TEXTS[3]]
    want = model.encode(queries, prompt_name="query", normalize_embeddings=True)
    want_docs = model.encode(TEXTS[:3], prompt_name="document", normalize_embeddings=True)

    async def run(s: Served) -> tuple[list[np.ndarray], list[np.ndarray]]:
        q = await s.infer.embed(queries, prompt_name="query")
        d = await s.infer.embed(TEXTS[:3], prompt_name="document")
        return q.values, d.values

    with served(folder) as native:
        got, got_docs = asyncio.run(run(native))
    assert_close_vectors(got, want, max_abs=1e-4, what="qwen3 queries with the prompt")
    assert_close_vectors(got_docs, want_docs, max_abs=1e-4, what="qwen3 documents")


def test_embeddinggemma_layout_with_bias_free_dense(tiny: Callable[..., Path]) -> None:
    """EmbeddingGemma: mean pooling, then two bias-free Dense projections, then normalize."""
    dense = [
        (32, 64, "torch.nn.modules.linear.Identity"),
        (64, 32, "torch.nn.modules.linear.Identity"),
    ]
    folder = tiny("gemma3_text", "embedding", "mean", dense=dense, dense_bias=False)
    want = st_encode(folder, TEXTS)
    with served(folder) as native:
        got = embed(native, TEXTS)
    assert_close_vectors(got, want, max_abs=1e-4, what="embeddinggemma vs sentence-transformers")


@pytest.mark.parametrize(
    ("arch", "task", "config"),
    [
        # One token type: the second text of a pair gets type 0, not the tokenizer's 1.
        ("roberta", "reranker", {}),
        ("distilbert", "classifier", {}),
        ("mpnet", "classifier", {}),
        ("modernbert", "classifier", {}),
        ("modernbert", "reranker", {"classifier_pooling": "mean"}),
        ("qwen3", "classifier", {}),
        # [SEP] as pad id: like Qwen's <|endoftext|>, the appended last token is also the pad.
        ("qwen3", "reranker", {"pad_token_id": 102}),
        ("qwen2", "reranker", {}),
        ("llama", "classifier", {}),
        ("gemma3_text", "classifier", {}),
    ],
)
def test_native_heads_match_transformers(
    tiny: Callable[..., Path], arch: str, task: str, config: dict[str, object]
) -> None:
    folder = tiny(arch, task, **config)
    # Classifier folders carry no sentence-transformers limit: the model's 512 positions apply.
    want = transformers_logits(folder, PAIRS, max_length=512)
    with served(folder, auto_truncate=True) as native:
        assert native.backend.name == "torch"
        packed = logits(native, PAIRS)
    with served(folder, backend="hf", auto_truncate=True) as fallback:
        padded = logits(fallback, PAIRS)
    assert_close_vectors(packed, want, max_abs=1e-4, what=f"{arch} {task} native logits")
    assert_close_vectors(padded, want, max_abs=1e-4, what=f"{arch} {task} fallback logits")
    if task == "reranker":
        query, passages = "how do magnets work", TEXTS[:3]
        want = transformers_logits(folder, [(query, p) for p in passages], max_length=512)
        with served(folder, auto_truncate=True) as native:
            ranked = asyncio.run(native.infer.rerank(query, passages, raw_scores=True)).values
        got = np.array([[score] for _, score in sorted(ranked)])
        assert_close_vectors(got, want, max_abs=1e-4, what=f"{arch} rerank")


@pytest.mark.parametrize("arch", ["distilbert", "mpnet", "modernbert"])
def test_splade_native_equals_fallback(tiny: Callable[..., Path], arch: str) -> None:
    """Native SPLADE heads (MLM head on the packed tokens) match transformers' masked-LM."""
    folder = tiny(arch, "mlm")
    with served(folder, pooling="splade") as auto:
        assert auto.backend.name == "torch"
        packed = embed(auto, TEXTS[-4:], normalize=False)
    with served(folder, pooling="splade", backend="hf") as fallback:
        padded = embed(fallback, TEXTS[-4:], normalize=False)
    assert packed.shape == (4, 30522)
    assert_close_vectors(packed, padded, max_abs=1e-4, what=f"{arch} splade")


# Configs as checkpoints on the Hub still spell them (written before transformers 5): rotary
# bases and layer patterns under their old names, with values unlike the defaults.
LEGACY_CONFIGS = {
    "modernbert": {
        "global_rope_theta": 80000.0,
        "local_rope_theta": 5000.0,
        "global_attn_every_n_layers": 2,
    },
    "gemma3_text": {
        "rope_theta": 50000.0,
        "rope_local_base_freq": 2000.0,
        # Gemma3 4B and up: linear scaling on the global layers only.
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "sliding_window_pattern": 2,
    },
    "qwen3": {"rope_theta": 50000.0, "rope_scaling": None, "use_sliding_window": False},
}


@pytest.mark.parametrize("arch", sorted(LEGACY_CONFIGS))
def test_pre_transformers5_config_keys(
    tiny: Callable[..., Path], tmp_path: Path, arch: str
) -> None:
    folder = tmp_path / arch
    shutil.copytree(tiny(arch, "embedding", "mean"), folder)
    config = json.loads((folder / "config.json").read_text())
    for key in ("rope_parameters", "layer_types"):
        config.pop(key, None)
    config.update(LEGACY_CONFIGS[arch])
    (folder / "config.json").write_text(json.dumps(config))
    texts = TEXTS[:6] + TEXTS[-3:]
    want = transformers_embed(folder, texts, "mean")
    with served(folder) as native:
        assert native.backend.name == "torch"
        got = embed(native, texts)
    assert_close_vectors(got, want, max_abs=1e-4, what=f"{arch} with a legacy config")
