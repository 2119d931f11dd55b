"""The reference libraries that cannot share the project's venv (FlagEmbedding, PyLate), run in
`.venv-ref` (`make reference`, which `make test` depends on) as a subprocess.

A test writes a tiny checkpoint folder, names a script of tests/refscripts/ and a JSON request,
and reads the script's JSON answer back: the reference never imports vectorpress, and the
project never imports the reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

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


def run_reference(script: str, request: dict[str, Any], timeout: float = 600.0) -> Any:
    """Run tests/refscripts/<script>.py on `request` in the reference venv; its JSON answer."""
    with tempfile.TemporaryDirectory(prefix="vp-ref-") as tmp:
        req, out = Path(tmp) / "request.json", Path(tmp) / "answer.json"
        req.write_text(json.dumps(request))
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
        done = subprocess.run(
            [str(ref_python()), str(SCRIPTS / f"{script}.py"), str(req), str(out)],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            raise RuntimeError(
                f"reference {script} failed ({done.returncode}): {done.stderr[-2000:]}"
            )
        return json.loads(out.read_text())
