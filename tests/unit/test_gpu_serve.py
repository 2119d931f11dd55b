"""bench/gpu_serve.py, the GPU benchmark's HTTP part, run on the CPU (VP_DEVICE=cpu) so that it
cannot rot between the rare runs on a GPU machine: the real server on a real socket, the real
model, the benchmark's own client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gpu_serve_measures_a_real_server_and_checks_its_vectors(tmp_path: Path) -> None:
    out = tmp_path / "serve.json"
    args = ["48", "--dtypes", "float32", "--out", str(out), "--trace"]
    done = subprocess.run(
        [sys.executable, "bench/gpu_serve.py", *args],
        cwd=ROOT,
        env={**os.environ, "VP_DEVICE": "cpu"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (row,) = json.loads(out.read_text())
    assert row["dtype"] == "float32" and "error" not in row
    assert row["cos_min"] >= 0.99999
    assert set(row["load"]) == {"1x64", "32x4", "32x16"}
    for figures in row["load"].values():
        assert figures["errors"] == 0 and figures["tokens_per_s"] > 0
        assert 1 <= figures["texts_per_batch"] <= 48
        # Traced in the server (bench/embed_trace.py): a pass's wall time and its thread's CPU.
        assert 0 < figures["pass_cpu_ms"] <= figures["pass_wall_ms"] * 1.05
        # Sampled in the server: every thread's CPU, the device thread's lines by wall time.
        sample = figures["sample"]
        assert sample["wall_s"] > 0
        assert any(name.startswith("vp-backend/") for name, _ in sample["threads"])
        lines = sample["stacks"]
        assert lines and all(0 <= cpu <= wall * 1.5 + 0.01 for _, wall, cpu in lines)
        assert any("embed" in stack or "_next" in stack for stack, _, _ in lines)
    assert 0 < row["overhead_ms"] < row["short_p50_ms"]
    assert "| float32 |" in done.stdout
    assert "| float32 | 32x16 |" in done.stdout
