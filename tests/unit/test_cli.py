"""CLI flags, their environment variables, defaults and one-line start-up errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers.process import ServerProcess
from vectorpress.cli import BUNDLED_MODEL_NAME, settings_from_args
from vectorpress.errors import StartupError


def test_defaults_follow_tei_except_model_and_port() -> None:
    s = settings_from_args(["serve"], env={})
    assert s.server.port == 8080 and s.server.hostname == "0.0.0.0"
    assert s.server.max_concurrent_requests == 512 and s.model.max_batch_tokens == 16384
    assert s.model.max_client_batch_size == 32 and s.model.auto_truncate is True
    assert s.server.payload_limit == 2_000_000 and s.model.max_batch_requests is None
    assert s.server.otlp_service_name == "text-embeddings-inference.server"
    assert Path(s.model.model_id, "config.json").is_file()
    assert s.model.model_name == BUNDLED_MODEL_NAME


def test_environment_variables_and_flags() -> None:
    env = {
        "MAX_BATCH_TOKENS": "2048",
        "AUTO_TRUNCATE": "false",
        "PORT": "9999",
        "CORS_ALLOW_ORIGIN": "http://a,http://b",
        "POOLING": "last-token",
        "API_KEY": "k",
        "MODEL_ID": "some/model",
    }
    s = settings_from_args(["serve"], env=env)
    assert (
        s.model.max_batch_tokens == 2048
        and s.model.auto_truncate is False
        and s.server.port == 9999
    )
    assert (
        s.server.cors_allow_origin == ("http://a", "http://b") and s.model.pooling == "last_token"
    )
    assert s.model.model_id == "some/model" and s.server.api_key == "k"
    # Flags win over the environment; a bare boolean flag means true.
    s = settings_from_args(
        [
            "serve",
            "--auto-truncate",
            "--max-batch-tokens",
            "512",
            "--cors-allow-origin",
            "http://c",
        ],
        env=env,
    )
    assert s.model.auto_truncate is True and s.model.max_batch_tokens == 512
    assert s.server.cors_allow_origin == ("http://c",)
    s = settings_from_args(["serve", "--auto-truncate", "false"], env={})
    assert s.model.auto_truncate is False


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--max-batch-tokens", "-5"], "max-batch-tokens"),
        (["--max-concurrent-requests", "0"], "max-concurrent-requests"),
        (["--dtype", "float8"], "dtype"),
        (["--pooling", "max"], "pooling"),
        (["--default-prompt", "a", "--default-prompt-name", "b"], "default-prompt"),
        (["--device-runners", "-1"], "device-runners"),
    ],
)
def test_invalid_values_raise_one_line(args: list[str], needle: str) -> None:
    with pytest.raises(StartupError) as info:
        settings_from_args(["serve", *args], env={})
    assert needle in str(info.value) and "\n" not in str(info.value)


def _run(args: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vectorpress", "serve", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
    )


def test_bad_start_exits_with_one_clear_line(tmp_path: Path) -> None:
    cases = [
        (["--max-batch-tokens", "-1"], "--max-batch-tokens must be a positive integer"),
        (["--model-id", str(tmp_path / "missing")], "does not exist"),
        (["--model-id", "nobody/no-such-model"], "cannot be reached"),
        (["--port", "abc"], "expected an integer"),
    ]
    for args, needle in cases:
        proc = _run(args)
        assert proc.returncode != 0
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and needle in lines[0], proc.stderr
        assert "Traceback" not in proc.stderr


def test_serve_subprocess_embeds_hello(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with ServerProcess(["--json-output"], env=env, logs=tmp_path) as srv:
        response = httpx.post(f"{srv.url}/embed", json={"inputs": "hello"}, timeout=30)
        assert response.status_code == 200
        vectors = response.json()
        assert len(vectors) == 1 and len(vectors[0]) == 384
        assert abs(float(np.linalg.norm(vectors[0])) - 1.0) < 1e-5
    assert srv.stop() == 0, srv.output()[-4000:]


def test_a_crash_in_native_code_leaves_every_threads_stack(tmp_path: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with ServerProcess([], env=env, logs=tmp_path) as srv:
        assert srv.proc is not None
        srv.proc.send_signal(signal.SIGABRT)  # what glibc or a C++ runtime raises on a fault
        assert srv.proc.wait(30) == -signal.SIGABRT
    out = srv.output()
    assert "Fatal Python error: Aborted" in out, out[-4000:]
    # The device thread's stack among the others (waiting for work in the scheduler).
    assert "Thread 0x" in out and "scheduler.py" in out, out[-4000:]
