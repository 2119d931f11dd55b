"""Texts tokenized straight into backend Batches, for tests that call a backend without the
server's pipeline around it."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np
from tokenizers import Tokenizer

from vectorpress.types import Batch, BatchOutput, Encoding


class Embeds(Protocol):
    def embed(self, batch: Batch) -> BatchOutput: ...


def tokenized_batches(
    folder: Path, texts: list[str], size: int | None = None, max_length: int = 256
) -> list[Batch]:
    """`texts` in batches of `size` (all in one when None), cut at `max_length` tokens."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()  # some tokenizer.json files pad every input to a fixed length
    tok.enable_truncation(max_length)
    encodings = [Encoding(ids=e.ids, type_ids=e.type_ids) for e in tok.encode_batch(texts)]
    step = size or max(1, len(encodings))
    return [Batch.from_encodings(encodings[i : i + step]) for i in range(0, len(encodings), step)]


def pooled(backend: Embeds, batches: list[Batch]) -> np.ndarray:
    """The pooled vectors of every batch, in order, as one array."""
    out = [backend.embed(batch).pooled for batch in batches]
    assert all(o is not None for o in out)
    return np.concatenate(out)  # type: ignore[arg-type]
