"""The benchmark model carried to a GPU machine without package registries (bench/gpu_prep.py):
small enough to travel, and rebuilt there as the same package with float32 weights."""

from __future__ import annotations

import filecmp
import subprocess
import sys
from pathlib import Path

import torch
from bench.gpu_prep import PACKAGE, WEIGHTS, installed_package, pack, restore
from safetensors.torch import load_file


def test_pack_and_restore_rebuild_the_package_with_float32_weights(tmp_path: Path) -> None:
    original = installed_package()
    packed = pack(tmp_path / "package")
    size = sum(f.stat().st_size for f in packed.rglob("*") if f.is_file())
    # What travels to the device is limited to 64 MiB with the working tree.
    assert size < 48 * 2**20, size
    rebuilt = restore(packed, tmp_path / "site")
    assert rebuilt == tmp_path / "site" / PACKAGE
    want = load_file(str(original / "model" / WEIGHTS))
    got = load_file(str(rebuilt / "model" / WEIGHTS))
    assert set(got) == set(want)
    for key, tensor in want.items():
        assert got[key].dtype == torch.float32, key
        assert torch.equal(got[key], tensor.half().float()), key
    files = sorted(
        str(p.relative_to(original))
        for p in original.rglob("*")
        if p.is_file() and p.name != WEIGHTS and "__pycache__" not in p.parts
    )
    match, mismatch, errors = filecmp.cmpfiles(original, rebuilt, files, shallow=False)
    assert not mismatch and not errors and match
    # With the folder first on the path, the package found is the rebuilt one.
    code = f"import importlib.util as u; print(u.find_spec({PACKAGE!r}).origin)"
    found = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(tmp_path / "site")},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(found).parent == rebuilt
