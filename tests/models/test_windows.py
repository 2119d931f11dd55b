"""Long inputs embedded as overlapping windows, against a reference computed window by window
with sentence-transformers' own modules on the same folder."""

from __future__ import annotations

import base64
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from tests.helpers.reference import assert_close_vectors
from tests.helpers.server import LiveServer
from tests.helpers.texts import mixed_texts
from vectorpress.settings import Settings

MAX_LENGTH = 128  # the tiny checkpoints' sentence_bert_config max_seq_length


def windows(folder: Path, text: str, overlap: int) -> list[list[int]]:
    """[CLS] + W content tokens + [SEP], every W - overlap tokens, until the text is covered."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    content = tok.encode(text, add_special_tokens=False).ids
    width = MAX_LENGTH - 2
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    out, start = [], 0
    while True:
        out.append([cls, *content[start : start + width], sep])
        if start + width >= len(content):
            return out
        start += width - overlap


def reference(folder: Path, texts: list[str], overlap: int) -> list[np.ndarray]:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    out = []
    for text in texts:
        parts, weights = [], []
        for ids in windows(folder, text, overlap):
            features = {
                "input_ids": torch.tensor([ids]),
                "attention_mask": torch.ones(1, len(ids), dtype=torch.long),
                "token_type_ids": torch.zeros(1, len(ids), dtype=torch.long),
            }
            with torch.inference_mode():
                parts.append(model(features)["sentence_embedding"][0].double().numpy())
            weights.append(len(ids))
        mean = np.average(np.stack(parts), axis=0, weights=weights)
        out.append(mean / np.linalg.norm(mean))
    return out


@pytest.mark.parametrize("overlap", [0, 16])
def test_long_inputs_pool_their_windows(tiny: Callable[..., Path], overlap: int) -> None:
    folder = tiny("bert", "embedding", "mean")
    long_texts = [" ".join(mixed_texts(12, seed=s)) for s in (1, 2)]
    texts = [*long_texts, "a short one"]
    assert all(len(windows(folder, t, overlap)) >= 3 for t in long_texts)
    want = reference(folder, texts, overlap)
    with LiveServer(Settings.single(str(folder), auto_truncate=False)) as srv:
        body = {"inputs": texts, "windowed": True, "window_overlap": overlap}
        r = httpx.post(f"{srv.url}/embed", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert_close_vectors(r.json(), want, max_abs=1e-5, what=f"overlap {overlap}")
        # Defaults stay TEI's: with truncation off, a long input is refused.
        r = httpx.post(f"{srv.url}/embed", json={"inputs": texts[0]}, timeout=60)
        assert r.status_code == 413 or r.status_code == 422, r.text
        r = httpx.post(
            f"{srv.url}/embed",
            json={"inputs": texts[0], "windowed": True, "window_overlap": MAX_LENGTH},
            timeout=60,
        )
        assert r.status_code == 422, r.text


def test_server_default_and_usage(tiny: Callable[..., Path]) -> None:
    folder = tiny("bert", "embedding", "mean")
    text = " ".join(mixed_texts(12, seed=1))
    settings = Settings.single(str(folder), windowed_inputs=True, window_overlap=8)
    want = reference(folder, [text], 8)
    with LiveServer(settings) as srv:
        r = httpx.post(f"{srv.url}/embed", json={"inputs": text}, timeout=60)
        assert r.status_code == 200, r.text
        assert_close_vectors(r.json(), want, max_abs=1e-5, what="default")
        r = httpx.post(f"{srv.url}/v1/embeddings", json={"input": text}, timeout=60)
        assert r.status_code == 200, r.text
        tokens = sum(len(w) for w in windows(folder, text, 8))
        assert r.json()["usage"]["prompt_tokens"] == tokens


def test_the_openai_bodies_ask_for_windows(tiny: Callable[..., Path]) -> None:
    """`windowed` / `window_overlap` on OpenAI's body (also Jina's, vLLM's and Infinity's
    route), through the openai SDK's extra_body and on Infinity's /embeddings path."""
    import openai

    folder = tiny("bert", "embedding", "mean")
    text = " ".join(mixed_texts(12, seed=2))
    want = reference(folder, [text, "short"], 16)
    with LiveServer(Settings.single(str(folder), auto_truncate=False)) as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="-", max_retries=0)
        got = client.embeddings.create(
            input=[text, "short"],
            model="m",
            extra_body={"windowed": True, "window_overlap": 16},
        )
        vectors = [d.embedding for d in got.data]
        assert_close_vectors(vectors, want, max_abs=1e-5, what="openai windowed")
        assert got.usage.prompt_tokens == sum(len(w) for w in windows(folder, text, 16)) + 3
        body = {"input": text, "windowed": True, "window_overlap": 16, "encoding_format": "base64"}
        r = httpx.post(f"{srv.url}/embeddings", json=body, timeout=60)
        assert r.status_code == 200, r.text
        vector = np.frombuffer(base64.b64decode(r.json()["data"][0]["embedding"]), "<f4")
        assert_close_vectors([vector], want[:1], max_abs=1e-5, what="/embeddings base64")
        # Without the field, --auto-truncate false refuses the long input as TEI does.
        with pytest.raises(openai.APIStatusError) as refused:
            client.embeddings.create(input=text, model="m")
        assert refused.value.status_code in (413, 422)
        r = httpx.post(
            f"{srv.url}/v1/embeddings",
            json={"input": text, "windowed": True, "window_overlap": MAX_LENGTH},
            timeout=60,
        )
        assert r.status_code == 422, r.text


def pair_windows(
    folder: Path, query: str, text: str, overlap: int, max_length: int
) -> list[list[int]]:
    """[CLS] query [SEP] window [SEP] for each window of the text."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_truncation()
    q = tok.encode(query, add_special_tokens=False).ids
    d = tok.encode(text, add_special_tokens=False).ids
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    width = max_length - len(q) - 3
    out, start = [], 0
    while True:
        part = d[start : start + width]
        out.append([cls, *q, sep, *part, sep])
        if start + width >= len(d):
            return out
        start += width - overlap


def test_long_documents_rerank_by_their_best_window(tiny: Callable[..., Path]) -> None:
    from sentence_transformers import CrossEncoder

    # Drawn wide, so that windows of one text score apart; ModernBERT reads no token types.
    folder = tiny("modernbert", "reranker", initializer_range=0.3)
    query = "how do I open a file and read its lines?"
    texts = [" ".join(mixed_texts(16, seed=s)) for s in range(3, 8)] + ["Open it with open()."]
    model = CrossEncoder(str(folder), device="cpu")
    want, first, later = [], [], 0
    for text in texts:
        scores = []
        parts = pair_windows(folder, query, text, 32, 512)
        assert len(parts) >= 2 or text == texts[-1]
        for ids in parts:
            with torch.inference_mode():
                logit = model.model(input_ids=torch.tensor([ids])).logits[0, 0]
            scores.append(float(torch.sigmoid(logit)))
        want.append(max(scores))
        first.append(scores[0])
        later += max(scores) > scores[0] + 1e-3
    assert later, "no text has its best window after the first: the test could not fail"
    # Cohere's body has no overlap: the server's --window-overlap applies to it.
    with LiveServer(Settings.single(str(folder), window_overlap=32)) as srv:
        body = {"query": query, "texts": texts, "windowed": True, "window_overlap": 32}
        r = httpx.post(f"{srv.url}/rerank", json=body, timeout=60)
        assert r.status_code == 200, r.text
        got = {h["index"]: h["score"] for h in r.json()}
        for i, score in enumerate(want):
            assert abs(got[i] - score) <= 1e-4, f"text {i}: {got[i]} != {score}"
        # Cohere's max_chunks_per_doc asks for windows and keeps each text's first ones: one
        # window is the first window's score, enough of them the best window's.
        for chunks, expected in ((1, first), (50, want)):
            body = {"query": query, "documents": texts, "max_chunks_per_doc": chunks}
            r = httpx.post(f"{srv.url}/v1/rerank", json=body, timeout=60)
            assert r.status_code == 200, r.text
            got = {h["index"]: h["relevance_score"] for h in r.json()["results"]}
            for i, score in enumerate(expected):
                assert abs(got[i] - score) <= 1e-4, f"{chunks} chunks, text {i}"
        r = httpx.post(
            f"{srv.url}/v1/rerank",
            json={"query": query, "documents": texts, "max_chunks_per_doc": 0},
            timeout=60,
        )
        assert r.status_code == 422 and "max_chunks_per_doc" in r.text, r.text
