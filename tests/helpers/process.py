"""`vectorpress serve` as a real subprocess with its own environment, on free loopback ports."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(python: str | Path = sys.executable) -> list[str]:
    return [str(python), "-m", "vectorpress", "serve"]


class ServerProcess:
    """`with ServerProcess(args, env=..., logs=tmp) as srv:` serves at `srv.url` until /health.

    `env` replaces the environment (huggingface_hub reads HF_ENDPOINT and HF_HUB_OFFLINE when it
    is imported, so each server gets its own). With `grpc=True`, gRPC listens at `grpc_target`.
    """

    def __init__(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        logs: Path,
        command: Sequence[str] | None = None,
        cwd: Path | None = None,
        grpc: bool = False,
        timeout: float = 180,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_port = free_port() if grpc else None
        self.grpc_target = f"127.0.0.1:{self.grpc_port}" if grpc else ""
        self.argv = [*(command or serve_command()), *args]
        self.argv += ["--hostname", "127.0.0.1", "--port", str(self.port)]
        if self.grpc_port is not None:
            self.argv += ["--grpc-port", str(self.grpc_port)]
        self.env = dict(env)
        self.cwd = cwd
        self.timeout = timeout
        logs.mkdir(parents=True, exist_ok=True)
        self.stdout_path = logs / f"server-{self.port}.out"
        self.stderr_path = logs / f"server-{self.port}.err"
        self.proc: subprocess.Popen[bytes] | None = None

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace") + self.stderr_path.read_text(
            errors="replace"
        )

    def __enter__(self) -> ServerProcess:
        with self.stdout_path.open("wb") as out, self.stderr_path.open("wb") as err:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, cwd=self.cwd, stdout=out, stderr=err
            )
        try:
            deadline = time.monotonic() + self.timeout
            while True:
                if self.proc.poll() is not None:
                    raise AssertionError(
                        f"server exited with {self.proc.returncode}:\n{self.output()[-4000:]}"
                    )
                try:
                    if httpx.get(f"{self.url}/health", timeout=10).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"server never answered /health:\n{self.output()[-4000:]}")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def run_to_exit(
    args: Sequence[str], *, env: Mapping[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """Run `vectorpress serve ARGS` expecting it to stop by itself (a start-up failure)."""
    argv = [*serve_command(), *args, "--hostname", "127.0.0.1", "--port", str(free_port())]
    return subprocess.run(
        argv, env=dict(env), capture_output=True, text=True, timeout=timeout, check=False
    )


def clean_env(**extra: str) -> dict[str, str]:
    """This environment less the variables that steer a server or huggingface_hub."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGINGFACE_")) and k not in ("API_KEY", "MODEL_ID")
    }
    env.update(extra)
    return env
