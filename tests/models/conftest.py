from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers.checkpoints import make_tiny


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """Build (once per session and arguments) a tiny random checkpoint of any ZOO architecture."""
    cache: dict[tuple[object, ...], Path] = {}

    def build(arch: str, task: str = "embedding", pooling: str = "mean", **kwargs: object) -> Path:
        key = (arch, task, pooling, repr(sorted(kwargs.items())))
        if key not in cache:
            folder = tmp_path_factory.mktemp(f"zoo-{arch}-{task}-{pooling}")
            cache[key] = make_tiny(folder, arch, task, pooling, **kwargs)  # type: ignore[arg-type]
        return cache[key]

    return build
