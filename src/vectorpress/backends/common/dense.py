"""sentence-transformers Dense modules, run after pooling by every backend."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vectorpress.backends.common.activations import activation
from vectorpress.backends.common.loader import load_state_dict, strict_load
from vectorpress.errors import StartupError
from vectorpress.model_spec import DenseSpec


class Dense(nn.Module):
    """A sentence-transformers Dense module: linear then activation."""

    def __init__(self, spec: DenseSpec) -> None:
        super().__init__()
        self.linear = nn.Linear(spec.in_features, spec.out_features, bias=spec.bias)
        self.act = activation(spec.activation) if spec.activation != "sigmoid" else torch.sigmoid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.linear(x))


def load_dense(spec: DenseSpec) -> Dense:
    module = Dense(spec)
    path = Path(spec.path)
    state = load_state_dict(path)
    state = {k.removeprefix("0."): v for k, v in state.items()}
    if not state:
        raise StartupError(f"Dense module {path} has no weights")
    strict_load(module, state, what=f"Dense module {path.name}")
    return module
