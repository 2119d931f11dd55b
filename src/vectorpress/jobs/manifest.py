"""The output folder of a job: shards, their completion records, rejects and the manifest.

    manifest.json                   the model (with its files' fingerprint), options, inputs, shards
    part-FFFFF-SSSSS.parquet        shard S of input file F, rows in input order
    rejects/part-FFFFF-SSSSS.jsonl  the shard's bad rows: {"row", "id", "reason"}
    _shards/part-FFFFF-SSSSS.json   written last, once the shard's files are in place

A shard is finished when its record exists; every file is written under a temporary name and
renamed, so a job killed at any point leaves finished shards and nothing half-written under a
final name. A rerun skips finished shards and redoes the rest, whether it runs locally or on
Ray, and refuses an output folder whose manifest names another model or other options.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vectorpress.errors import JobError

FORMAT = "vectorpress-embed/1"
#: Model fields whose difference means different vectors (the id and revision may differ for
#: the same files, e.g. a Hub id then its cached folder).
_COMPARED = ("fingerprint", "dtype", "pooling", "dense_path", "default_prompt",
             "default_prompt_name", "backend")  # fmt: skip


@dataclass
class ShardRecord:
    name: str
    file: int
    shard: int
    first_row: int
    input_rows: int
    rows: int
    rejects: int
    tokens: int
    seconds: float
    worker: str

    @staticmethod
    def from_dict(data: dict[str, Any]) -> ShardRecord:
        return ShardRecord(**data)


def shard_name(file: int, shard: int) -> str:
    return f"part-{file:05d}-{shard:05d}"


def write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Output:
    """One job's output folder."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    @property
    def manifest_path(self) -> Path:
        return self.folder / "manifest.json"

    def shard_path(self, name: str) -> Path:
        return self.folder / f"{name}.parquet"

    def rejects_path(self, name: str) -> Path:
        return self.folder / "rejects" / f"{name}.jsonl"

    def record_path(self, name: str) -> Path:
        return self.folder / "_shards" / f"{name}.json"

    def prepare(self, header: dict[str, Any]) -> None:
        """Create the folder, or check that its manifest is this job's; writes the header."""
        for sub in ("", "rejects", "_shards"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        if self.manifest_path.exists():
            old = json.loads(self.manifest_path.read_text())
            self._check_same(old, header)
        # What a killed run was writing; its shard is redone.
        for stale in self.folder.glob("**/.*.tmp"):
            stale.unlink(missing_ok=True)
        self.write_manifest(header, self.records())

    @staticmethod
    def _check_same(old: dict[str, Any], new: dict[str, Any]) -> None:
        if old.get("format") != FORMAT:
            raise JobError("the output folder holds something else than a vectorpress job")
        was, now = old["model"], new["model"]
        for key in _COMPARED:
            if was.get(key) != now.get(key):
                what = "model files" if key == "fingerprint" else key
                raise JobError(
                    f"the output folder holds vectors of {was.get('model_id')!r} with another "
                    f"{what} ({was.get(key)!r}, now {now.get(key)!r}); refusing to mix "
                    "outputs: use another --output folder"
                )
        for key in ("options", "inputs"):
            if old.get(key) != new.get(key):
                raise JobError(
                    f"the output folder was written with other {key} ({old.get(key)!r}); "
                    "rerun with the same arguments or use another --output folder"
                )

    def records(self) -> list[ShardRecord]:
        """Finished shards whose files are all there."""
        out = []
        for path in sorted((self.folder / "_shards").glob("part-*.json")):
            record = ShardRecord.from_dict(json.loads(path.read_text()))
            if self.shard_path(record.name).exists():
                out.append(record)
        return out

    def finished(self) -> set[str]:
        return {r.name for r in self.records()}

    def write_shard(
        self, name: str, table: Any, rejects: Iterable[dict[str, Any]], record: ShardRecord
    ) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        write_atomic(self.shard_path(name), sink.getvalue().to_pybytes())
        lines = b"".join(json.dumps(r, default=str).encode() + b"\n" for r in rejects)
        write_atomic(self.rejects_path(name), lines)
        write_atomic(self.record_path(name), json.dumps(asdict(record)).encode())

    def write_manifest(
        self, header: dict[str, Any], records: list[ShardRecord], complete: bool = False
    ) -> None:
        body = dict(header)
        body["shards"] = [asdict(r) for r in sorted(records, key=lambda r: r.name)]
        body["rows"] = sum(r.rows for r in records)
        body["rejects"] = sum(r.rejects for r in records)
        body["tokens"] = sum(r.tokens for r in records)
        body["complete"] = complete
        body["updated"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        write_atomic(self.manifest_path, json.dumps(body, indent=2).encode())
