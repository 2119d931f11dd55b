"""Several models from the command line: repeated --model-id, MODEL_ID lists, --config files, and
the start-ups that must stop at once with one line and exit code 1."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.helpers.process import free_port
from vectorpress.cli import settings_from_args
from vectorpress.errors import StartupError


def test_repeated_model_ids_take_names_by_position() -> None:
    s = settings_from_args(
        ["serve", "--model-id", "a/x", "--model-id", "b/y", "--served-model-name", "x"], env={}
    )
    assert [(m.model_id, m.model_name) for m in s.models] == [("a/x", "x"), ("b/y", "b/y")]
    # The model-scope flags apply to every model given on the command line.
    s = settings_from_args(
        ["serve", "--model-id", "a", "--model-id", "b", "--dtype", "float16"], env={}
    )
    assert [m.dtype for m in s.models] == ["float16", "float16"]
    assert s.model.model_id == "a", "the first is the default"


def test_model_id_environment_list() -> None:
    env = {"MODEL_ID": "a, b", "SERVED_MODEL_NAME": "first,second", "MAX_BATCH_TOKENS": "1024"}
    s = settings_from_args(["serve"], env=env)
    assert [(m.model_id, m.model_name, m.max_batch_tokens) for m in s.models] == [
        ("a", "first", 1024),
        ("b", "second", 1024),
    ]
    # Flags win over the environment, as for every other flag.
    s = settings_from_args(["serve", "--model-id", "c", "--served-model-name", "z"], env=env)
    assert [(m.model_id, m.model_name) for m in s.models] == [("c", "z")]


def test_config_tables_over_the_flags(tmp_path: Path) -> None:
    config = tmp_path / "models.toml"
    config.write_text(
        """
[[models]]
model_id = "org/embedder"
served_model_name = "embedder"
aliases = ["e", "dense"]
max-batch-tokens = 4096
default_prompt_name = "query"

[[models]]
model_id = "org/splade"
pooling = "splade"
auto_truncate = false
"""
    )
    s = settings_from_args(
        ["serve", "--config", str(config), "--dtype", "bfloat16", "--port", "9000"], env={}
    )
    embedder, splade = s.models
    assert embedder.names == ("embedder", "e", "dense") and embedder.max_batch_tokens == 4096
    assert embedder.default_prompt_name == "query" and embedder.dtype == "bfloat16"
    assert splade.model_name == "org/splade" and splade.pooling == "splade"
    assert splade.auto_truncate is False and splade.max_batch_tokens == 16384
    assert s.server.port == 9000
    from_env = settings_from_args(["serve"], env={"VECTORPRESS_CONFIG": str(config)})
    assert [m.names for m in from_env.models] == [m.names for m in s.models]
    assert [m.dtype for m in from_env.models] == [None, None]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("[[models]\nmodel_id = 'a'\n", "is not valid TOML"),
        ("[[models]]\nmodel_id = 'a'\nmax_tokens = 5\n", "unknown key 'max_tokens'"),
        ("[[models]]\nmodel_id = 'a'\n[[models]]\nmodel_id = 'a'\n", "two models are named 'a'"),
        (
            "[[models]]\nmodel_id = 'a'\nserved_model_name = 'x'\n"
            "[[models]]\nmodel_id = 'b'\naliases = ['x']\n",
            "two models are named 'x'",
        ),
        ("[[models]]\nmodel_id = 'a'\nmax_batch_tokens = '8'\n", "must be an integer"),
        ("[[models]]\nmodel_id = 'a'\nauto_truncate = 1\n", "must be a boolean"),
        ("[[models]]\nmodel_id = 'a'\ndtype = 'float8'\n", "--dtype must be one of"),
        ("[[models]]\nserved_model_name = 'a'\n", "model_id is required"),
        ("models = 1\n", "no [[models]] table"),
        ("[server]\nport = 1\n", "unknown top-level key 'server'"),
    ],
)
def test_bad_config_files_raise_one_line(tmp_path: Path, body: str, needle: str) -> None:
    config = tmp_path / "models.toml"
    config.write_text(body)
    with pytest.raises(StartupError) as info:
        settings_from_args(["serve", "--config", str(config)], env={})
    assert needle in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_bad_model_lists_raise_one_line(tmp_path: Path) -> None:
    cases = [
        (["--model-id", "a", "--model-id", "a"], "two models are named 'a'"),
        (["--model-id", "a", "--served-model-name", "x", "--served-model-name", "y"], "at most"),
        (["--config", str(tmp_path / "none.toml")], "--config"),
        (["--config", str(tmp_path / "m.toml"), "--model-id", "a"], "not both"),
    ]
    (tmp_path / "m.toml").write_text("[[models]]\nmodel_id = 'a'\n")
    for args, needle in cases:
        with pytest.raises(StartupError) as info:
            settings_from_args(["serve", *args], env={})
        assert needle in str(info.value) and "\n" not in str(info.value), args


def _serve(args: list[str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "vectorpress", "serve", "--hostname", "127.0.0.1", *args],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _one_line_exit_1(proc: subprocess.Popen[str], needle: str) -> str:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 1, (out[-2000:], err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err
    return out


def test_bad_start_ups_exit_1_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "models.toml"
    for body, needle in (
        ("[[models]\n", "is not valid TOML"),
        ("[[models]]\nmodel_id = 'a'\nfoo = 1\n", "unknown key 'foo'"),
        (
            "[[models]]\nmodel_id = 'a'\nserved_model_name = 'm'\n"
            "[[models]]\nmodel_id = 'b'\nserved_model_name = 'm'\n",
            "two models are named 'm'",
        ),
    ):
        config.write_text(body)
        _one_line_exit_1(_serve(["--config", str(config)]), needle)


def test_a_model_that_fails_to_load_stops_everything(
    tmp_path: Path, tiny_bert_family: Callable[..., Path]
) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(tiny_bert_family("bert", "reranker"), broken)
    (broken / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    port = free_port()
    good = tiny_bert_family("bert", "embedding", "mean")
    models = ["--model-id", str(good), "--model-id", str(broken)]
    names = ["--served-model-name", "good", "--served-model-name", "broken"]
    proc = _serve(["--port", str(port), *models, *names])
    out = _one_line_exit_1(proc, "model broken")
    # The first model had loaded; the socket never opened.
    assert "model loaded and warmed up" in out and "Ready" not in out
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_serve_a_config_file(tmp_path: Path, tiny_bert_family: Callable[..., Path]) -> None:
    config = tmp_path / "models.toml"
    embedder = tiny_bert_family("bert", "embedding", "mean")
    reranker = tiny_bert_family("bert", "reranker")
    config.write_text(
        f"[[models]]\nmodel_id = '{embedder}'\nserved_model_name = 'e'\n"
        f"[[models]]\nmodel_id = '{reranker}'\nserved_model_name = 'r'\naliases = ['rank']\n"
    )
    port = free_port()
    proc = _serve(["--port", str(port), "--config", str(config)])
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                listed = httpx.get(f"{url}/v1/models", timeout=30)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not open its port"
                time.sleep(0.2)
        assert [m["id"] for m in listed.json()["data"]] == ["e", "r"]
        rerank = {"query": "q", "texts": ["a", "b"], "model": "rank"}
        assert httpx.post(f"{url}/rerank", json=rerank, timeout=30).status_code == 200
        assert httpx.post(f"{url}/embed", json={"inputs": "a"}, timeout=30).status_code == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    assert proc.returncode == 0
