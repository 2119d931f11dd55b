"""Input files for the batch-job tests: the same rows as Parquet, JSONL, CSV and text."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

#: Row indices holding a bad value, and the reason the job must give.
BAD = {5: "null", 7: "empty", 11: "empty"}


def rows(n: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        words = " ".join(f"w{(i * 7 + j) % 50}" for j in range(1 + (i * 13) % 40))
        out.append({"id": f"doc-{i}", "text": f"passage {i}: {words}"})
    out[5]["text"] = None
    out[7]["text"] = ""
    out[11]["text"] = "   "
    return out


def write_parquet(path: Path, data: list[dict[str, Any]], row_group_size: int = 64) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": [r["id"] for r in data], "text": [r["text"] for r in data]})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_jsonl(path: Path, data: list[dict[str, Any]]) -> Path:
    with path.open("w") as f:
        for r in data:
            f.write(json.dumps(r) + "\n")
    return path


def write_csv(path: Path, data: list[dict[str, Any]]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", "text"])
        for r in data:
            writer.writerow([r["id"], "" if r["text"] is None else r["text"]])
    return path


def read_output(folder: Path) -> Any:
    """Every shard of a job's output as one table, in shard order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pa.concat_tables(pq.read_table(p) for p in sorted(folder.glob("part-*.parquet")))
