"""--dtype bfloat16 on the CPU stays within cosine 0.999 of float32 on the benchmark corpus."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from bench.corpus import corpus

from tests.helpers.reference import assert_close_vectors
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import Settings
from vectorpress.types import Batch, Encoding


def test_bfloat16_within_0999_of_float32_on_a_corpus_sample(minilm: Path) -> None:
    from tokenizers import Tokenizer

    # Every tenth text of the benchmark corpus: its mix of short, medium and long (truncated)
    # inputs.
    texts = corpus(400, seed=0)[::10]
    tok = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    batch = Batch.from_encodings(
        [Encoding(ids=e.ids, type_ids=e.type_ids) for e in tok.encode_batch(texts)]
    )
    spec = load_model_spec(minilm, Settings(model_id=str(minilm)))
    vectors = {}
    for dtype in ("float32", "bfloat16"):
        backend = TorchBackend(spec, "cpu", dtype)
        out = backend.embed(batch).pooled
        assert out is not None
        vectors[dtype] = out
    assert vectors["bfloat16"].dtype == np.float32
    assert not np.allclose(vectors["bfloat16"], vectors["float32"], atol=1e-6), "not bf16 at all"
    assert_close_vectors(
        vectors["bfloat16"], vectors["float32"], min_cos=0.999, what="bf16 vs fp32"
    )
