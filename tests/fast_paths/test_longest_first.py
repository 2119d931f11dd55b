"""A batch run longest first (CpuPasses.longest_first) gives each text the vector it gets in
arrival order, in the caller's order, in one pass and in several."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.helpers.batches import tokenized_batches
from tests.helpers.reference import assert_close_vectors
from tests.helpers.texts import mixed_texts
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.backends.torch.passes import CpuPasses
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings


def test_longest_first_gives_the_vectors_of_arrival_order(minilm: Path) -> None:
    spec = load_model_spec(minilm, ModelSettings(str(minilm)))
    backend = TorchBackend(spec, "cpu", "float32")
    texts = mixed_texts(40, seed=3)
    # Repeats, so that equal lengths arrive apart from each other.
    texts = texts + texts[::3]
    (batch,) = tokenized_batches(minilm, texts)
    lengths = np.diff(batch.cu_seqlens).tolist()
    assert lengths != sorted(lengths, reverse=True)
    plan = backend.passes.plan
    out = {}
    for max_tokens in (4096, 500):
        for longest_first in (False, True):
            backend.passes = CpuPasses(max_tokens, plan, longest_first)
            got = backend.embed(batch)
            assert got.pooled is not None
            out[max_tokens, longest_first] = got.pooled
    want = out[4096, False]
    for key, got in out.items():
        assert_close_vectors(got, want, min_cos=0.999999, max_abs=1e-5, what=str(key))
    # Not the same vectors in another order: each text's own.
    assert not np.allclose(want[:-1], want[1:], atol=1e-3)
