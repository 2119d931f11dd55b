"""The sdist and wheel from a clean copy of the tree, installed into a fresh virtual environment.

The installed server runs with no source tree around: outside the checkout, without PYTHONPATH,
with bytecode writing off so that any file it wrote into site-packages would show.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest

from tests.helpers.process import ServerProcess, clean_env
from vectorpress.api.grpc.stubs import pb, pb_grpc

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
# A bare torch requirement would pull a multi-GB CUDA build; the pinned CPU build goes first,
# as the Makefile does.
TORCH = "torch==2.13.0"
TEXT = "a package that installs and runs anywhere"


@dataclass
class Installed:
    python: Path
    site: Path
    tmp: Path
    timings: dict[str, float]

    def env(self, **extra: str) -> dict[str, str]:
        env = clean_env(
            **{
                "HOME": str(self.tmp / "home"),
                "VECTORPRESS_CACHE": str(self.tmp / "user-cache"),
                "PYTHONDONTWRITEBYTECODE": "1",
                "HF_HUB_OFFLINE": "1",
                **extra,
            }
        )
        env.pop("PYTHONPATH", None)
        env.pop("XDG_CACHE_HOME", None)
        return env


def _tree(root: Path) -> dict[str, int]:
    return {
        str(p.relative_to(root)): p.stat().st_mtime_ns
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _copy_checkout(dest: Path) -> None:
    """What a clean clone holds: tracked files and untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        rel = raw.decode()
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("package")
    timings: dict[str, float] = {}
    venv = tmp / "venv"
    python = venv / "bin" / "python"
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # torch installs while the package builds: they are the two slow steps.
    torch_log = (tmp / "torch.log").open("w")
    torch = subprocess.Popen(
        [str(python), "-m", "pip", "install", "--quiet", "--no-compile", TORCH],
        stdout=torch_log,
        stderr=subprocess.STDOUT,
    )
    try:
        checkout = tmp / "checkout"
        _copy_checkout(checkout)
        assert not (checkout / "src/vectorpress/api/grpc/_generated").exists()
        dist = tmp / "dist"
        built = subprocess.run(
            [sys.executable, "-m", "build", "--outdir", str(dist), str(checkout)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
        timings["build"] = time.monotonic() - start
        sdists, wheels = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
        assert len(sdists) == 1 and len(wheels) == 1, sorted(p.name for p in dist.iterdir())
        assert torch.wait(600) == 0, (tmp / "torch.log").read_text()[-3000:]
    finally:
        if torch.poll() is None:
            torch.kill()
        torch_log.close()
    timings["torch"] = time.monotonic() - start
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--no-compile", str(wheels[0])],
        capture_output=True,
        text=True,
        check=False,
    )
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    timings["install"] = time.monotonic() - start
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    (tmp / "elsewhere").mkdir()
    yield Installed(python, site, tmp, timings)
    print(f"\npackage test timings (s, cumulative): {timings}")


def test_the_wheel_carries_the_proto_and_stubs_built_from_it(installed: Installed) -> None:
    grpc_dir = installed.site / "vectorpress" / "api" / "grpc"
    assert (grpc_dir / "tei.proto").is_file()
    made = sorted(p.name for p in (grpc_dir / "_generated").iterdir())
    assert made == ["__init__.py", "tei_pb2.py", "tei_pb2.pyi", "tei_pb2_grpc.py"]
    assert "DescriptorPool().AddSerializedFile" in (grpc_dir / "_generated/tei_pb2.py").read_text()
    # The short-pass kernel's source, which a server compiles on its first start.
    assert (installed.site / "vectorpress/backends/torch/short_kernel.c").is_file()
    # Nothing of the checkout leaks into the installed package.
    assert not (installed.site / "tests").exists()


def test_installed_server_answers_http_and_grpc_without_the_source_tree(
    installed: Installed, tiny_bert_family: Callable[..., Path]
) -> None:
    from sentence_transformers import SentenceTransformer

    model = tiny_bert_family()
    package = installed.site / "vectorpress"
    before = _tree(package)
    start = time.monotonic()
    with ServerProcess(
        ["--model-id", str(model)],
        command=[str(installed.python.parent / "vectorpress"), "serve"],
        env=installed.env(),
        cwd=installed.tmp / "elsewhere",
        logs=installed.tmp / "logs",
        grpc=True,
    ) as srv:
        installed.timings["server start"] = time.monotonic() - start
        answer = httpx.post(f"{srv.url}/embed", json={"inputs": TEXT}, timeout=60)
        assert answer.status_code == 200, answer.text
        http_vector = np.array(answer.json()[0], dtype=np.float32)
        with grpc.insecure_channel(srv.grpc_target) as channel:
            reply = pb_grpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs=TEXT), timeout=60)
        grpc_vector = np.array(reply.embeddings, dtype=np.float32)
        # The server ran from site-packages, not from a tree on its path.
        assert "vectorpress" not in srv.env.get("PYTHONPATH", "")
    reference = SentenceTransformer(str(model), device="cpu").encode(
        TEXT, normalize_embeddings=True
    )
    assert http_vector.shape == reference.shape
    np.testing.assert_allclose(http_vector, reference, atol=1e-4)
    np.testing.assert_allclose(grpc_vector, http_vector, atol=1e-6)
    # No file was added or changed in site-packages, and no stubs were made anywhere else.
    assert _tree(package) == before
    assert not (installed.tmp / "user-cache").exists()


def _stub_origin(installed: Installed, cache: Path) -> str:
    code = (
        "from vectorpress.api.grpc.stubs import pb\n"
        "assert pb.EmbedRequest(inputs='x', dimensions=3).dimensions == 3\n"
        "print(pb.__file__)\n"
    )
    run = subprocess.run(
        [str(installed.python), "-c", code],
        env=installed.env(VECTORPRESS_CACHE=str(cache)),
        cwd=installed.tmp / "elsewhere",
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.strip()


def test_stubs_an_installed_package_cannot_use_are_made_in_a_user_cache(
    installed: Installed,
) -> None:
    """Stubs from a newer protoc than the runtime accepts, or none: made again, not in place."""
    generated = installed.site / "vectorpress" / "api" / "grpc" / "_generated"
    pb2 = generated / "tei_pb2.py"
    original = pb2.read_text()
    try:
        # What protoc writes for a runtime newer than the one installed.
        newer = re.sub(r"(Domain\.PUBLIC,\s*)\d+", r"\g<1>99", original, count=1)
        assert newer != original
        pb2.write_text(newer)
        before = _tree(installed.site / "vectorpress")
        cache = installed.tmp / "cache-newer"
        origin = _stub_origin(installed, cache)
        assert Path(origin).is_relative_to(cache), origin
        assert _tree(installed.site / "vectorpress") == before
    finally:
        pb2.write_text(original)

    moved = installed.tmp / "generated-aside"
    os.replace(generated, moved)
    try:
        cache = installed.tmp / "cache-missing"
        origin = _stub_origin(installed, cache)
        assert Path(origin).is_relative_to(cache), origin
        assert not generated.exists()
    finally:
        os.replace(moved, generated)
