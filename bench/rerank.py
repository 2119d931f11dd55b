"""The rerank benchmark's parts: a reranker checkpoint with a real one's shapes, and its load.

No real cross-encoder installs from a package registry, so the checkpoint is
cross-encoder/ms-marco-MiniLM-L-6-v2's architecture (BertForSequenceClassification, 6 layers,
hidden 384, 12 heads, FFN 1,536, 512 positions, one label) with random weights, seeded, and the
all-MiniLM-L6-v2 WordPiece tokenizer (the same uncased vocabulary of 30,522). Throughput does not
depend on the weights' values; the scores are compared with CrossEncoder's on the same folder.

The load: each query (a short corpus text) with 20 passages (medium corpus texts, 2-6
sentences, as MS MARCO's passages are a paragraph), one `/rerank` request per query.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from bench.corpus import corpus, kind
from bench.tokens import bench_tokenizer

PER_QUERY = 20

#: cross-encoder/ms-marco-MiniLM-L-6-v2's config.json, less its weights' provenance.
MS_MARCO_MINILM = {
    "architectures": ["BertForSequenceClassification"],
    "hidden_size": 384,
    "intermediate_size": 1536,
    "num_hidden_layers": 6,
    "num_attention_heads": 12,
    "max_position_embeddings": 512,
    "type_vocab_size": 2,
    "vocab_size": 30522,
    "hidden_act": "gelu",
    "layer_norm_eps": 1e-12,
    "num_labels": 1,
}


def reranker_folder(cache: Path, seed: int = 0) -> Path:
    """The checkpoint, built once under `cache` (offline: transformers and the bundled
    tokenizer)."""
    import torch
    import transformers as tf
    from tests.helpers.checkpoints import copy_tokenizer

    key = f"{tf.__version__}-{seed}"
    folder = cache / f"reranker-ms-marco-MiniLM-L-6-v2-shapes-{key}"
    if (folder / "model.safetensors").is_file():
        return folder
    config = tf.BertConfig(**{k: v for k, v in MS_MARCO_MINILM.items() if k != "architectures"})
    torch.manual_seed(seed)
    model = tf.BertForSequenceClassification(config).eval()
    tmp = folder.with_name(folder.name + ".tmp")
    model.save_pretrained(tmp)
    copy_tokenizer(tmp)
    tmp.rename(folder)
    return folder


def rerank_queries(n: int, seed: int = 0) -> list[tuple[str, list[str]]]:
    """n queries, each with PER_QUERY passages, from the benchmark corpus."""
    size = n * PER_QUERY * 3  # 40% of a corpus is medium passages
    texts = corpus(size, seed=seed + 1)
    queries = [t for i, t in enumerate(texts) if kind(i) == "short"]
    passages = [t for i, t in enumerate(texts) if kind(i) == "medium"]
    return [(queries[q], passages[q * PER_QUERY : (q + 1) * PER_QUERY]) for q in range(n)]


def pair_lengths(folder: Path, queries: list[tuple[str, list[str]]]) -> list[list[int]]:
    """Tokens of each query's pairs, pair by pair (truncated at the model's max_length, 512)."""
    tok = bench_tokenizer(folder)
    return [
        [len(e.ids) for e in tok.encode_batch([(q, p) for p in passages])]
        for q, passages in queries
    ]


def cross_encoder_run(
    folder: Path, queries: list[tuple[str, list[str]]], threads: int
) -> tuple[float, list[list[float]]]:
    """sentence-transformers' CrossEncoder.predict, one call per query as a reranking caller
    makes it: the seconds over all queries, and each query's scores (sigmoid, as /rerank's)."""
    import torch
    from sentence_transformers import CrossEncoder

    torch.set_num_threads(threads)
    model = CrossEncoder(str(folder), device="cpu")
    q, passages = queries[0]
    model.predict([(q, p) for p in passages], batch_size=32)
    scores: list[list[float]] = []
    t = time.perf_counter()
    for q, passages in queries:
        out = model.predict([(q, p) for p in passages], batch_size=32)
        scores.append([float(x) for x in out])
    return time.perf_counter() - t, scores


def rerank_body(query: str, passages: list[str]) -> dict[str, Any]:
    return {"query": query, "texts": passages, "truncate": True}


def scores_of(body: bytes, n: int) -> list[float]:
    """A /rerank answer's scores in the passages' order."""
    out = [float("nan")] * n
    for item in json.loads(body):
        out[int(item["index"])] = float(item["score"])
    return out
