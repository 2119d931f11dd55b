"""The reference libraries that cannot share the project's venv (FlagEmbedding, PyLate), run in
`.venv-ref` (`make reference`, which `make test` depends on) as a subprocess.

A test writes a tiny checkpoint folder, names a script of tests/refscripts/ and a JSON request,
and reads the script's JSON answer back: the reference never imports vectorpress, and the
project never imports the reference. The scripts run in one worker process for the session
(`tests/refscripts/worker.py`), which imports the libraries once.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "refscripts"


def ref_python() -> Path:
    """The reference venv's interpreter: $VECTORPRESS_REF_PYTHON, else ROOT/.venv-ref."""
    override = os.environ.get("VECTORPRESS_REF_PYTHON")
    path = Path(override) if override else ROOT / ".venv-ref" / "bin" / "python"
    if not path.is_file():
        raise RuntimeError(
            f"the reference venv is missing ({path}); build it with `make reference` "
            "(make test does it once)"
        )
    return path


class _Worker:
    """tests/refscripts/worker.py in the reference venv; its stderr goes to a file, which a
    pipe nobody reads would fill."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
        # Open for the worker's whole life, not one block: closed with it at the process' end.
        self.log: IO[bytes] = tempfile.TemporaryFile(prefix="vp-ref-worker-")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(ref_python()), str(SCRIPTS / "worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            env=env,
        )

    def log_tail(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-2000:]

    def run(self, script: str, request: Path, answer: Path, timeout: float) -> dict[str, Any]:
        """The worker's reply to one job; raises where the worker died or ran past `timeout`
        (and is then stopped: the next job starts another)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        job = {"script": script, "request": str(request), "answer": str(answer)}
        try:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it died: the read below says so
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.stop()
            why = "ran past its timeout" if not ready else f"exited ({self.proc.returncode})"
            raise RuntimeError(f"reference {script}: the worker {why}: {self.log_tail()}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_worker: _Worker | None = None
_lock = threading.Lock()


def _stop_worker() -> None:
    if _worker is not None and _worker.alive():
        _worker.stop()


atexit.register(_stop_worker)


def run_reference(script: str, request: dict[str, Any], timeout: float = 600.0) -> Any:
    """Run tests/refscripts/<script>.py on `request` in the reference venv; its JSON answer."""
    global _worker
    with _lock, tempfile.TemporaryDirectory(prefix="vp-ref-") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / "answer.json"
        req.write_text(json.dumps(request))
        if _worker is None or not _worker.alive():
            _worker = _Worker()
        reply = _worker.run(script, req, out, timeout)
        if not reply["ok"]:
            raise RuntimeError(f"reference {script} failed: {reply['error'][-2000:]}")
        return json.loads(out.read_text())
