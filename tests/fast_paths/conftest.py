"""The benchmark corpus and its float32 vectors, shared by the int8 accuracy tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bench.corpus import corpus

from tests.helpers.batches import pooled, tokenized_batches
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings
from vectorpress.types import Batch


@pytest.fixture(scope="session")
def corpus_batches(minilm: Path) -> list[Batch]:
    """The whole default benchmark corpus (1,200 texts: short, medium, long and truncated)."""
    return tokenized_batches(minilm, corpus(1200, seed=0), 64)


@pytest.fixture(scope="session")
def corpus_fp32(minilm: Path, corpus_batches: list[Batch]) -> np.ndarray:
    """MiniLM's float32 vectors of `corpus_batches` on the torch backend."""
    spec = load_model_spec(minilm, ModelSettings(str(minilm)))
    return pooled(TorchBackend(spec, "cpu", "float32"), corpus_batches)
