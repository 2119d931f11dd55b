"""The device a backend runs on, from `--device`."""

from __future__ import annotations

import torch

from vectorpress.errors import StartupError


def pick_device(requested: str) -> str:
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise StartupError("--device cuda was asked for but no CUDA device is available")
    return requested
