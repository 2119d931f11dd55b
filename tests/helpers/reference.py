"""Reference outputs and comparisons: what the project's numbers are checked against."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vectorpress.server import load
from vectorpress.settings import Settings


def assert_close_vectors(
    got: Sequence[Any],
    want: Sequence[Any],
    *,
    min_cos: float = 0.99999,
    max_abs: float | None = None,
    what: str = "",
) -> None:
    """Every pair of vectors has cosine >= min_cos (and max |diff| <= max_abs when given)."""
    assert len(got) == len(want), f"{what}: {len(got)} vectors, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=False)):
        g = np.asarray(g, dtype=np.float64)
        w = np.asarray(w, dtype=np.float64)
        assert g.shape == w.shape, f"{what}[{i}]: shape {g.shape} != {w.shape}"
        cos = float(g @ w / (np.linalg.norm(g) * np.linalg.norm(w)))
        diff = float(np.abs(g - w).max())
        assert cos >= min_cos, f"{what}[{i}]: cosine {cos:.7f}; got {g[:4]} want {w[:4]}"
        if max_abs is not None:
            assert diff <= max_abs, (
                f"{what}[{i}]: max abs diff {diff:.2e}; got {g[:4]} want {w[:4]}"
            )


def st_encode(folder: Path, texts: Sequence[str], normalize: bool = True) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return model.encode(list(texts), normalize_embeddings=normalize, batch_size=16)


def vp_embed(
    folder: Path, texts: Sequence[str], normalize: bool = True, **settings: Any
) -> list[np.ndarray]:
    """Embed in-process through the whole pipeline (tokenizer pool, queue, worker, backend)."""
    served = load(Settings.single(str(folder), **settings))
    try:

        async def run() -> list[np.ndarray]:
            out: list[np.ndarray] = []
            for i in range(0, len(texts), 32):
                result = await served.infer.embed(list(texts[i : i + 32]), normalize=normalize)
                out.extend(result.values)
            return out

        return asyncio.run(run())
    finally:
        served.close()
