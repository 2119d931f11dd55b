"""Where backends keep what they build from a model's weights at start-up."""

from __future__ import annotations

from pathlib import Path


def build_cache(hub_cache: str | None = None) -> Path:
    """Beside the downloads (`--huggingface-hub-cache`, else the Hub's default), so a cache
    volume that keeps the weights between restarts keeps what was built from them too: the onnx
    backend's exported and quantized graphs (hence the name), and the torch backend's compiled
    short-pass kernel (`torch/short_kernel.py`, under `kernels/`)."""
    from huggingface_hub import constants

    return Path(hub_cache or constants.HF_HUB_CACHE) / "vectorpress-onnx"
