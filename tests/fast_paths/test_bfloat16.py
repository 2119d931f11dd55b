"""--dtype bfloat16 on the CPU stays within cosine 0.999 of float32 on the benchmark corpus."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from bench.corpus import corpus

from tests.helpers.batches import pooled, tokenized_batches
from tests.helpers.reference import assert_close_vectors
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings


def test_bfloat16_within_0999_of_float32_on_a_corpus_sample(minilm: Path) -> None:
    # Every tenth text of the benchmark corpus: its mix of short, medium and long (truncated)
    # inputs.
    batches = tokenized_batches(minilm, corpus(400, seed=0)[::10])
    spec = load_model_spec(minilm, ModelSettings(str(minilm)))
    vectors = {
        dtype: pooled(TorchBackend(spec, "cpu", dtype), batches)
        for dtype in ("float32", "bfloat16")
    }
    assert vectors["bfloat16"].dtype == np.float32
    assert not np.allclose(vectors["bfloat16"], vectors["float32"], atol=1e-6), "not bf16 at all"
    assert_close_vectors(
        vectors["bfloat16"], vectors["float32"], min_cos=0.999, what="bf16 vs fp32"
    )
