"""Texts tokenized straight into backend Batches, for tests that call a backend without the
server's pipeline around it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import numpy as np
from tokenizers import Tokenizer

from tests.helpers.reference import assert_close_vectors
from vectorpress.types import Batch, BatchOutput, Encoding


class Embeds(Protocol):
    def embed(self, batch: Batch) -> BatchOutput: ...


def tokenized_batches(
    folder: Path,
    texts: list[str],
    size: int | None = None,
    max_length: int = 256,
    position_offset: int = 0,
) -> list[Batch]:
    """`texts` in batches of `size` (all in one when None), cut at `max_length` tokens, their
    positions from `position_offset` (the model spec's: 2 for RoBERTa and MPNet)."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()  # some tokenizer.json files pad every input to a fixed length
    tok.enable_truncation(max_length)
    encodings = [
        Encoding(ids=e.ids, type_ids=e.type_ids, position_offset=position_offset)
        for e in tok.encode_batch(texts)
    ]
    step = size or max(1, len(encodings))
    return [Batch.from_encodings(encodings[i : i + step]) for i in range(0, len(encodings), step)]


def pooled(backend: Embeds, batches: list[Batch]) -> np.ndarray:
    """The pooled vectors of every batch, in order, as one array."""
    out = [backend.embed(batch).pooled for batch in batches]
    assert all(o is not None for o in out)
    return np.concatenate(out)  # type: ignore[arg-type]


def alone_and_together(backend: Embeds, folder: Path, texts: list[str]) -> tuple[np.ndarray, ...]:
    """`texts`' pooled vectors embedded one per batch, and all in one batch."""
    alone = pooled(backend, tokenized_batches(folder, texts, 1))
    return alone, pooled(backend, tokenized_batches(folder, texts, len(texts)))


def assert_quantized_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """`got` (a quantized path's vectors) within cosine 0.99 of `want`, and not equal to it."""
    assert not np.allclose(got, want, atol=1e-4), f"{what}: not quantized at all"
    assert_close_vectors(got, want, min_cos=0.99, what=what)


def graph_runs(backend: Any) -> list[tuple[int, ...]]:
    """The `input_ids` shape of every graph run an OnnxBackend makes from now on."""
    shapes: list[tuple[int, ...]] = []
    run = backend.session.run

    def watched(names: Any, feeds: dict[str, np.ndarray]) -> Any:
        shapes.append(feeds["input_ids"].shape)
        return run(names, feeds)

    backend.session = SimpleNamespace(run=watched)
    return shapes
