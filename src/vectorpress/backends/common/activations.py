"""Activation functions by the names configs give them (transformers' ACT2FN spelling)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from vectorpress.errors import StartupError

Activation = Callable[[torch.Tensor], torch.Tensor]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


# Names as transformers' ACT2FN spells them. "gelu" is the exact erf form there, and parity with
# the reference needs the same choice (TEI switched to tanh in 1.9 and drifts by ~1e-4).
_ACTIVATIONS: dict[str, Activation] = {
    "gelu": F.gelu,
    "gelu_new": _gelu_tanh,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_fast": _gelu_tanh,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
    "tanh": torch.tanh,
    "identity": lambda x: x,
}


def activation(name: str) -> Activation:
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise StartupError(f"activation {name!r} is not supported") from None
