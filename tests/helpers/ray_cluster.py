"""A real Ray cluster on this machine for the tests: a head node and a second node process,
each started with `ray start`, on loopback only, with few CPUs and a small object store.

Stopped by killing exactly the processes this cluster started (found by its own temporary
folder and address, then their children), never by name, so that nothing else on the machine
is touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import psutil

from tests.helpers.process import free_port

RAY = Path(sys.executable).with_name("ray")


#: Ray's single-machine switch (its default on macOS and Windows): with it, Ray keeps 127.0.0.1
#: as a node's address instead of turning it into the machine's own. The head node, the
#: drivers (the tests, `vectorpress embed --ray-address`) and every worker process they start
#: run with it.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
#: No token authentication (a loopback cluster of one test), whatever ~/.ray holds: a token
#: left there by another Ray session would otherwise be sent to some nodes and not others.
AUTH_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN_PATH": "/nonexistent/vectorpress"}
#: No usage reports: without it a driver's Ray Data runs leave threads behind that query a
#: Prometheus on localhost:9090 for their report, in the test process, after the tests.
USAGE_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}


def ray_env(head: bool = True) -> dict[str, str]:
    """The environment of `ray start` and of the tests' drivers.

    `ray start` refuses to add a node under the single-machine switch, so the second node
    starts without it, through tests/helpers/ray_node.py, which keeps its 127.0.0.1 as well.
    """
    env = dict(os.environ)
    env.update(USAGE_ENV)
    env["RAY_DEDUP_LOGS"] = "0"
    env.update(AUTH_ENV)
    if head:
        env.update(LOOPBACK_ENV)
    else:
        env.pop("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", None)
    return env


class RayCluster:
    def __init__(self, head_cpus: int = 2, worker_cpus: int = 2, store_mb: int = 150) -> None:
        self.head_cpus = head_cpus
        self.worker_cpus = worker_cpus
        self.store = store_mb * 1_000_000
        # Short: Ray's socket paths live under it and must stay within 107 bytes.
        self.temp_dir = tempfile.mkdtemp(prefix="vpr-", dir="/tmp")
        self.gcs_port = free_port()
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.env = ray_env(head=True)

    def _node_ports(self) -> list[str]:
        names = (
            "node-manager-port",
            "object-manager-port",
            "dashboard-agent-listen-port",
            "dashboard-agent-grpc-port",
            "runtime-env-agent-port",
            "metrics-export-port",
        )
        return [f"--{name}={free_port()}" for name in names]

    def _start(self, args: list[str], head: bool) -> None:
        with tempfile.TemporaryFile() as log:
            self._run_start(args, head, log)

    def _run_start(self, args: list[str], head: bool, log: Any) -> None:
        common = ["--node-ip-address=127.0.0.1", f"--object-store-memory={self.store}",
                  "--disable-usage-stats"]  # fmt: skip
        command = [str(RAY)] if head else [sys.executable, "-m", "tests.helpers.ray_node"]
        done = subprocess.run(
            [*command, "start", *args, *common, *self._node_ports()],
            cwd=Path(__file__).resolve().parents[2],
            stdin=subprocess.DEVNULL,
            env=ray_env(head),
            # Files, not pipes: the daemons it starts would hold a pipe open.
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=180,
        )
        if done.returncode != 0:
            log.seek(0)
            raise RuntimeError(f"ray start failed:\n{log.read().decode(errors='replace')[-4000:]}")

    def __enter__(self) -> RayCluster:
        try:
            self._start(
                [
                    "--head",
                    f"--port={self.gcs_port}",
                    f"--num-cpus={self.head_cpus}",
                    f"--temp-dir={self.temp_dir}",
                    "--include-dashboard=false",
                    f"--ray-client-server-port={free_port()}",
                    f"--dashboard-port={free_port()}",
                    '--resources={"head_node": 1}',
                ],
                head=True,
            )
            self._start(
                [
                    f"--address={self.address}",
                    f"--num-cpus={self.worker_cpus}",
                    '--resources={"second_node": 1}',
                ],
                head=False,
            )
            self._wait_for_nodes(2)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_for_nodes(self, n: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done = subprocess.run(
                [str(RAY), "status", f"--address={self.address}"],
                env=self.env, capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            if done.returncode == 0 and done.stdout.count(" node_") >= n:
                return
            time.sleep(1)
        raise RuntimeError(f"the cluster did not reach {n} nodes")

    def processes(self) -> list[psutil.Process]:
        """This cluster's processes: those naming its folder or address, and their children."""
        roots = []
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or [])
            if self.temp_dir in cmdline or self.address in cmdline:
                roots.append(proc)
        found = {p.pid: p for p in roots}
        for proc in roots:
            try:
                for child in proc.children(recursive=True):
                    found[child.pid] = child
            except psutil.NoSuchProcess:
                continue
        return list(found.values())

    def stop(self) -> None:
        for _ in range(3):
            procs = [p for p in self.processes() if p.pid != os.getpid()]
            if not procs:
                break
            for proc in procs:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
            psutil.wait_procs(procs, timeout=10)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
