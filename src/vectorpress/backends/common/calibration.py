"""The int8 recipe both quantizers follow (the torch backend's fbgemm layers and the ONNX
graph's, `onnx/quantize.py`): the packaged calibration texts, SmoothQuant's migration strength,
the weight levels this CPU's kernels can take, and the row range of a layer's inputs.

Why this recipe: see `torch/int8.py`.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer

from vectorpress.errors import StartupError
from vectorpress.model_spec import ModelSpec
from vectorpress.types import Batch, Encoding

CALIBRATION = Path(__file__).with_name("data") / "calibration.txt"
# SmoothQuant's migration strength: half of each channel's activation range moves to weights.
ALPHA = 0.5


def weight_levels() -> int:
    """Levels on each side of zero an int8 weight may take here (see the module's note)."""
    vnni = getattr(torch.cpu, "_is_vnni_supported", None)
    return 127 if vnni is not None and vnni() else 63


WEIGHT_LEVELS = weight_levels()


def row_range(low: float) -> float:
    """A layer's calibrated `low` (how far below zero its rows reach, relative to their top),
    kept where a scale stays usable: [1/64, 1]."""
    return min(max(low, 1 / 64), 1.0)


def smoothing(weight: torch.Tensor, amax: torch.Tensor | None, alpha: float) -> torch.Tensor:
    """SmoothQuant's factor per input channel: the weights are multiplied by it and the
    activations divided, so that channels with outliers lose their range to the weights."""
    if amax is None:  # never met in calibration
        return torch.ones(weight.shape[1])
    w = weight.detach().float()
    return amax.float().clamp_min(1e-5) ** alpha / (w.abs().amax(0).clamp_min(1e-5) ** (1 - alpha))


def calibration_encodings(spec: ModelSpec) -> list[Encoding]:
    """The packaged calibration texts, tokenized for `spec` (truncated at its input limit)."""
    path = spec.path / "tokenizer.json"
    if not path.is_file():
        raise StartupError(f"{spec.path} has no tokenizer.json to calibrate with")
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.enable_truncation(spec.max_input_length)
    texts = [t for t in CALIBRATION.read_text(encoding="utf-8").splitlines() if t.strip()]
    return [
        Encoding(ids=e.ids, type_ids=e.type_ids, position_offset=spec.position_offset)
        for e in tok.encode_batch(texts)
    ]


def calibration_batch(spec: ModelSpec) -> Batch:
    return Batch.from_encodings(calibration_encodings(spec))
