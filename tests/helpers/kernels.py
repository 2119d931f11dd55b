"""The compiled kernel (backends/torch/short_kernel.py) built once per test run.

The suite's build cache (`build_cache()`: conftest points HF_HUB_CACHE at a folder of this run)
holds one compiled library for every test that is not about building it; each folder of a
test's own compiled it again (about 4 s on a 2-core machine, 45 times a run).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from vectorpress.backends.common.cache import build_cache
from vectorpress.backends.torch.short_kernel import load_library


def run_cache() -> Path:
    """The build cache of this test run, shared by every test and in-process server."""
    return build_cache()


def warm_kernels(hub_cache: Path) -> None:
    """The run's compiled library placed where a server given `--huggingface-hub-cache
    hub_cache` looks for it, as a cache volume kept between restarts holds it: for tests of
    downloads and exports, not of the build (a compiler that differs only misses it)."""
    lib = load_library(run_cache())
    if lib is None or lib._name is None:  # no kernel on this CPU or build
        return
    built = Path(lib._name)
    dest = build_cache(str(hub_cache)) / "kernels" / built.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, dest)
