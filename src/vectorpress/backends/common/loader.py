"""Weights from a checkpoint folder into a module, strictly.

Loading fails on any missing or unexpected key and on any shape mismatch: a silently
half-loaded model gives plausible but wrong vectors, which is the worst failure an embedding
server can have.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import nn

from vectorpress.errors import StartupError


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint: safetensors (single or sharded), else PyTorch pickles."""
    from safetensors.torch import load_file

    single = folder / "model.safetensors"
    if single.is_file():
        return load_file(str(single))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for shard in shards:
            state.update(load_file(str(folder / shard)))
        return state
    pickles = sorted(folder.glob("pytorch_model*.bin"))
    if pickles:
        state = {}
        for path in pickles:
            state.update(torch.load(path, map_location="cpu", weights_only=True))
        return state
    raise StartupError(f"no weights (model.safetensors or pytorch_model.bin) in {folder}")


def remap(
    state: Mapping[str, torch.Tensor],
    rules: Iterable[tuple[str, str | None]],
    default_prefix: str = "",
) -> dict[str, torch.Tensor]:
    """Rename checkpoint keys by the first matching regex; a None target drops the key.

    Keys that no rule matches get `default_prefix`. LayerNorm `gamma`/`beta` of old checkpoints
    become `weight`/`bias`.
    """
    compiled = [(re.compile(pattern), target) for pattern, target in rules]
    out = {}
    for key, tensor in state.items():
        key = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", key))
        for pattern, target in compiled:
            if pattern.search(key):
                if target is None:
                    break
                out[pattern.sub(target, key, count=1)] = tensor
                break
        else:
            out[default_prefix + key] = tensor
    return out


def strict_load(
    module: nn.Module,
    state: Mapping[str, torch.Tensor],
    *,
    what: str,
) -> None:
    """Load `state` into `module`."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {_short(missing)}")
        if unexpected:
            parts.append(f"unexpected {_short(unexpected)}")
        raise StartupError(f"cannot load {what}: " + "; ".join(parts))
    for key, tensor in expected.items():
        if tuple(state[key].shape) != tuple(tensor.shape):
            raise StartupError(
                f"cannot load {what}: {key} has shape {tuple(state[key].shape)}, "
                f"expected {tuple(tensor.shape)}"
            )
    module.load_state_dict(state, strict=True)


def _short(keys: list[str]) -> str:
    shown = ", ".join(keys[:5])
    return shown + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
