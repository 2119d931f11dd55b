"""bench/side_load.py: the pass alone, then beside a second process's slices of work."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_probe_reports_the_pass_alone_and_beside_each_slicing() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "side_load.py"), "--backend", "torch",
         "--dtype", "float32", "--texts", "64", "--periods", "5,50", "--rounds", "1"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    # The backend and dtype the probe built, as it names them.
    assert " CPUs, torch float32, 64 corpus texts" in out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")]
    rows = [[cell.strip() for cell in r] for r in rows if r[0].strip() != "side work"]
    assert [(r[0], r[1]) for r in rows] == [
        ("none", "-"), ("0.5 ms every 5 ms", "200/s"), ("5 ms every 50 ms", "20/s"),
    ]  # fmt: skip
    assert rows[0][3] == "1.00"
    for row in rows:
        assert float(row[2].replace(",", "")) > 0 and 0 < float(row[3]) < 10
