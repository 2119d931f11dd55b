"""Parts a model reads only into float32 work keep their checkpoint values in a bfloat16 model."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings


def test_mpnets_relative_position_bias_stays_float32_in_a_bfloat16_model(
    tiny: Callable[..., Path],
) -> None:
    # Rounded to bfloat16, all-mpnet-base-v2's table had cost one benchmark text cosine 0.9973 to
    # float32 (tests/fast_paths/test_bfloat16.py watches that text on the real weights).
    folder = tiny("mpnet")
    spec = load_model_spec(folder, ModelSettings(str(folder)))
    exact, half = (TorchBackend(spec, "cpu", dtype) for dtype in ("float32", "bfloat16"))
    table = half.model.encoder.encoder.relative_attention_bias.weight
    assert table.dtype == torch.float32
    assert torch.equal(table, exact.model.encoder.encoder.relative_attention_bias.weight)
    assert not torch.equal(table, table.bfloat16().float()), "the random table is bf16-exact"
    # Everything else is cast.
    assert half.model.encoder.embeddings.word_embeddings.weight.dtype == torch.bfloat16
    assert half.model.encoder.encoder.layer[0].output.dense.weight.dtype == torch.bfloat16
    assert torch.equal(half.model.encoder.score_bias(9), exact.model.encoder.score_bias(9))
