"""`--model-id org/name` downloaded from a local server speaking the Hub's protocol.

Each server runs as a subprocess with its own environment: huggingface_hub reads HF_ENDPOINT and
HF_HUB_OFFLINE when it is imported.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers.checkpoints import make_bert_family
from tests.helpers.fake_hub import FakeHub, sha256
from tests.helpers.kernels import warm_kernels
from tests.helpers.process import ServerProcess, clean_env, run_to_exit

REPO = "vp-test/tiny-bert"
TOKEN = "hf_fakeHubToken123"
TEXT = "downloaded from the hub"
#: What a repository holds besides what serving needs; none of it may be fetched.
NOT_NEEDED = ("pytorch_model.bin", "onnx/model.onnx", "flax_model.msgpack", "README.md")


def reference(folder: Path) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(folder), device="cpu").encode(TEXT, normalize_embeddings=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two commits of one repository, with different weights, and the files serving skips."""
    out = {}
    for name, seed in (("old", 1), ("new", 2)):
        folder = make_bert_family(tmp_path_factory.mktemp(f"hub-{name}"), seed=seed)
        (folder / "pytorch_model.bin").write_bytes(b"pickle weights that must not be fetched")
        (folder / "onnx").mkdir()
        (folder / "onnx" / "model.onnx").write_bytes(b"a graph that must not be fetched")
        (folder / "flax_model.msgpack").write_bytes(b"flax weights")
        (folder / "README.md").write_text("# tiny bert\n")
        out[name] = folder
    return out


@pytest.fixture
def hub(checkpoints: dict[str, Path]) -> Iterator[FakeHub]:
    fake = FakeHub(token=TOKEN)
    fake.add_commit(REPO, checkpoints["old"], refs=("v1",))
    fake.add_commit(REPO, checkpoints["new"], refs=("main",))
    with fake.serving():
        yield fake


def hub_env(hub: FakeHub, tmp: Path, **extra: str) -> dict[str, str]:
    return clean_env(
        HF_ENDPOINT=hub.endpoint,
        HF_HOME=str(tmp / "hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        **extra,
    )


def embed(srv: ServerProcess) -> np.ndarray:
    answer = httpx.post(f"{srv.url}/embed", json={"inputs": TEXT}, timeout=60)
    assert answer.status_code == 200, answer.text
    return np.array(answer.json()[0], dtype=np.float32)


def start_args(cache: Path, *more: str) -> list[str]:
    """The server's arguments, its cache holding the compiled kernel as a kept volume would."""
    warm_kernels(cache)
    return ["--model-id", REPO, "--huggingface-hub-cache", str(cache), "--hf-token", TOKEN, *more]


def error_line(run: object) -> str:
    """The start-up error: exit code 1 and one `vectorpress: error:` line, no traceback."""
    assert run.returncode == 1, run.stdout + run.stderr  # type: ignore[attr-defined]
    stderr = run.stderr  # type: ignore[attr-defined]
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if line.startswith("vectorpress: error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def test_download_fetches_only_what_serving_needs_with_the_token(
    hub: FakeHub, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    env = hub_env(hub, tmp_path)
    with ServerProcess(start_args(cache), env=env, logs=tmp_path) as srv:
        np.testing.assert_allclose(embed(srv), reference(checkpoints["new"]), atol=1e-4)
    fetched = set(hub.downloads())
    assert {"config.json", "tokenizer.json", "model.safetensors", "modules.json"} <= fetched
    assert "1_Pooling/config.json" in fetched
    assert not fetched & set(NOT_NEEDED), fetched
    # The token reaches every Hub request and never the storage host the weights come from.
    assert all(
        s.headers.get("authorization") == f"Bearer {TOKEN}" for s in hub.seen if s.server == "hub"
    )
    storage = hub.storage_gets()
    assert storage and all("authorization" not in {k.lower() for k in s.headers} for s in storage)
    # Everything went into --huggingface-hub-cache, nothing into HF_HOME.
    snapshot = cache / "models--vp-test--tiny-bert" / "snapshots" / hub.repos[REPO].refs["main"]
    assert (snapshot / "model.safetensors").is_file()
    assert not (snapshot / "pytorch_model.bin").exists()
    assert not (tmp_path / "hf-home" / "hub").exists()


def test_without_the_token_a_private_repository_is_a_clear_error(
    hub: FakeHub, tmp_path: Path
) -> None:
    run = run_to_exit(
        ["--model-id", REPO, "--huggingface-hub-cache", str(tmp_path / "cache")],
        env=hub_env(hub, tmp_path),
    )
    line = error_line(run)
    assert REPO in line and "not found or not accessible" in line, line


@pytest.mark.parametrize("pin", ["v1", "commit"])
def test_revision_pins_the_commit_served(
    hub: FakeHub, checkpoints: dict[str, Path], tmp_path: Path, pin: str
) -> None:
    old = hub.repos[REPO].refs["v1"]
    revision = old if pin == "commit" else "v1"
    cache = tmp_path / "cache"
    with ServerProcess(
        start_args(cache, "--revision", revision), env=hub_env(hub, tmp_path), logs=tmp_path
    ) as srv:
        served = embed(srv)
    np.testing.assert_allclose(served, reference(checkpoints["old"]), atol=1e-4)
    assert np.abs(served - reference(checkpoints["new"])).max() > 1e-2
    resolved = {
        s.path.split("/resolve/")[1].split("/")[0] for s in hub.seen if "/resolve/" in s.path
    }
    assert resolved == {old}
    assert (cache / "models--vp-test--tiny-bert" / "snapshots" / old / "config.json").is_file()


def test_offline_serves_from_a_warm_cache_and_stops_clearly_on_a_cold_one(
    hub: FakeHub, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    with ServerProcess(start_args(cache), env=hub_env(hub, tmp_path), logs=tmp_path):
        pass
    hub.seen.clear()
    offline = hub_env(hub, tmp_path, HF_HUB_OFFLINE="1")
    with ServerProcess(start_args(cache), env=offline, logs=tmp_path) as srv:
        np.testing.assert_allclose(embed(srv), reference(checkpoints["new"]), atol=1e-4)
    assert hub.seen == []

    cold = run_to_exit(start_args(tmp_path / "cold"), env=offline)
    line = error_line(cold)
    assert REPO in line and "not in the local cache" in line, line
    assert hub.seen == []


def test_a_repository_that_does_not_exist_is_a_clear_error(hub: FakeHub, tmp_path: Path) -> None:
    run = run_to_exit(
        ["--model-id", "vp-test/no-such-model", "--hf-token", TOKEN], env=hub_env(hub, tmp_path)
    )
    line = error_line(run)
    assert "vp-test/no-such-model" in line and "not found or not accessible" in line, line


def test_a_revision_that_does_not_exist_is_a_clear_error(hub: FakeHub, tmp_path: Path) -> None:
    run = run_to_exit(
        start_args(tmp_path / "cache", "--revision", "v9"), env=hub_env(hub, tmp_path)
    )
    line = error_line(run)
    assert REPO in line and "v9" in line, line


def test_a_download_cut_midway_fails_clearly_and_the_next_start_completes_it(
    hub: FakeHub, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    weights = (checkpoints["new"] / "model.safetensors").read_bytes()
    digest = sha256(weights)
    hub.cut_at[digest] = len(weights) // 2
    cache = tmp_path / "cache"
    env = hub_env(hub, tmp_path)
    line = error_line(run_to_exit(start_args(cache), env=env))
    assert REPO in line and "broke off" in line and "start again" in line, line
    blobs = cache / "models--vp-test--tiny-bert" / "blobs"
    assert not (blobs / digest).exists()
    # huggingface_hub drops the partial file: nothing of the weights is left to be mistaken.
    assert all(p.stat().st_size < len(weights) // 4 for p in blobs.iterdir())

    del hub.cut_at[digest]
    hub.seen.clear()
    with ServerProcess(start_args(cache), env=env, logs=tmp_path) as srv:
        np.testing.assert_allclose(embed(srv), reference(checkpoints["new"]), atol=1e-4)
    assert hashlib.sha256((blobs / digest).read_bytes()).hexdigest() == digest
    assert not list(blobs.glob("*.incomplete"))
    # The next start fetched the weights whole, once.
    gets = hub.storage_gets()
    assert len(gets) == 1 and "range" not in {k.lower() for k in gets[0].headers}


def test_offline_start_after_a_cut_download_does_not_serve_the_partial_file(
    hub: FakeHub, tmp_path: Path
) -> None:
    weights_sha = next(
        sha256(data)
        for name, data in hub.repos[REPO].commits[hub.repos[REPO].refs["main"]].items()
        if name == "model.safetensors"
    )
    hub.cut_at[weights_sha] = 1000
    cache = tmp_path / "cache"
    error_line(run_to_exit(start_args(cache), env=hub_env(hub, tmp_path)))
    offline = hub_env(hub, tmp_path, HF_HUB_OFFLINE="1")
    line = error_line(run_to_exit(start_args(cache), env=offline))
    assert REPO in line and "not complete in the local cache" in line, line


def test_a_local_folder_never_asks_the_hub(
    hub: FakeHub, checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    folder = tmp_path / "vp-test" / "tiny-bert"
    shutil.copytree(checkpoints["new"], folder)
    warm_kernels(tmp_path / "hf-home" / "hub")  # HF_HOME's cache
    with ServerProcess(
        ["--model-id", str(folder)], env=hub_env(hub, tmp_path), logs=tmp_path
    ) as srv:
        np.testing.assert_allclose(embed(srv), reference(checkpoints["new"]), atol=1e-4)
    assert hub.seen == []
