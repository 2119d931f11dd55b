"""The benchmark model carried to a GPU machine without package registries (bench/gpu_prep.py):
small enough to travel, and rebuilt there as the same package with float32 weights."""

from __future__ import annotations

import filecmp
import shutil
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


def _wheel(folder: Path, name: str, requires: list[str], module: str | None = None) -> Path:
    """A minimal real wheel of `name` 1.0: `module`.py saying its name, and its requirements."""
    import zipfile

    dist = name.replace("-", "_")
    info = f"{dist}-1.0.dist-info"
    files = {
        f"{info}/METADATA": "\n".join(
            ["Metadata-Version: 2.1", f"Name: {name}", "Version: 1.0"]
            + [f"Requires-Dist: {r}" for r in requires]
        )
        + "\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    if module:
        files[f"{module}.py"] = f"NAME = {name!r}\n"
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    path = folder / f"{dist}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for f, text in files.items():
            z.writestr(f, text)
    return path


def test_carried_wheels_are_what_the_target_lacks_and_what_they_need(tmp_path: Path) -> None:
    from bench.gpu_prep import carried, have_names, install

    wheels = [
        _wheel(tmp_path, "server-dep", ["leaf>=1", "had-dep", "old-only; python_version < '3'"]),
        _wheel(tmp_path, "leaf", [], module="leaf_module"),
        _wheel(tmp_path, "had-dep", ["reached-only-through-had"]),
        _wheel(tmp_path, "reached-only-through-had", []),
        _wheel(tmp_path, "old-only", []),
        _wheel(tmp_path, "grpcio", []),
        _wheel(tmp_path, "torch", []),
        _wheel(tmp_path, "left-out", []),
    ]
    have_file = tmp_path / "have.txt"
    have_file.write_text("# the target's pip list\nhad_dep==0.9\nGRPCIO==1.0\nunrelated\n")
    have = have_names(have_file)
    assert have == {"had-dep", "grpcio", "unrelated"}
    requirements = ["server-dep", "grpcio>=1", "torch>=2", "left-out"]
    chosen = carried(requirements, wheels, have, "3.12", without=frozenset({"left-out"}))
    # What the target has keeps its own requirements; grpcio travels whatever the target has
    # (the gRPC stubs refuse an older one); torch never does; markers are read for 3.12.
    assert sorted(p.name.split("-")[0] for p in chosen) == ["grpcio", "leaf", "server_dep"]
    carry = tmp_path / "carry"
    carry.mkdir()
    for wheel in chosen:
        shutil.copy2(wheel, carry)
    site = tmp_path / "site"
    install(carry, site)
    code = "import leaf_module; print(leaf_module.NAME)"
    found = subprocess.run(
        [sys.executable, "-c", code], env={"PYTHONPATH": str(site)}, capture_output=True, text=True
    )
    assert found.stdout.strip() == "leaf", found.stderr
