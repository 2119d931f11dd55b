"""bench/tokenize_threads.py: one row per thread count and arena cap, each from its own
process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_probe_reports_cpu_per_text_for_each_arena_cap() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "tokenize_threads.py"), "--threads", "1,2"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout  # fmt: skip
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ")]
    rows = [r for r in rows if r[0].strip().isdigit()]
    # Threads 1: default, 2 and 3 arenas (the server's cap for one tokenizer thread); 2:
    # default, 2 and 4.
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [
        ("1", "default"), ("1", "2"), ("1", "3"), ("2", "default"), ("2", "2"), ("2", "4"),
    ]  # fmt: skip
    for row in rows:
        wall = float(row[2].replace(",", ""))
        cpu = float(row[3].split("(")[0].replace(",", ""))
        assert 0 < wall < 100_000 and 0 < cpu < 100_000
    assert rows[0][4].strip() == "1.00"
