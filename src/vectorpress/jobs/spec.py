"""What a batch job is: its inputs, options and output folder, all plain and picklable."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vectorpress.errors import JobError
from vectorpress.jobs.encodings import ENCODINGS
from vectorpress.jobs.inputs import Columns, detect_format
from vectorpress.settings import ModelSettings

TASKS = ("auto", "embed", "sparse", "predict")

#: ModelSettings that change what a model outputs; a rerun must agree on them.
MODEL_FIELDS = (
    "model_id",
    "revision",
    "dtype",
    "pooling",
    "dense_path",
    "default_prompt",
    "default_prompt_name",
    "backend",
)

# A job's vectors must not depend on which machine ran a shard, nor a rerun's on its machine.
AUTO_DTYPE = (
    "--dtype auto picks per machine; a job names its dtype (float32, bfloat16, ...) so that "
    "every shard, on any worker, and any rerun compute the same vectors"
)


@dataclass(frozen=True)
class JobSpec:
    inputs: tuple[str, ...]
    output: str
    columns: Columns = field(default_factory=Columns)
    format: str | None = None
    task: str = "auto"
    encoding: str = "float32"
    normalize: bool = True
    dimensions: int | None = None
    prompt_name: str | None = None
    truncate: bool | None = None
    shard_rows: int = 10_000
    """Rows per output shard: the unit of work, of resume and of length sorting."""
    block_rows: int = 1024
    """Rows read at a time."""

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise JobError(f"--task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.encoding not in ENCODINGS:
            raise JobError(
                f"--encoding must be one of {', '.join(ENCODINGS)}, got {self.encoding!r}"
            )
        for name in ("shard_rows", "block_rows"):
            if getattr(self, name) <= 0:
                raise JobError(f"--{name.replace('_', '-')} must be a positive integer")

    def formats(self) -> list[str]:
        return [detect_format(Path(p), self.format) for p in self.inputs]

    def options(self) -> dict[str, Any]:
        """The options a rerun must repeat, as the manifest records them."""
        return {
            "columns": asdict(self.columns),
            "task": self.task,
            "encoding": self.encoding,
            "normalize": self.normalize,
            "dimensions": self.dimensions,
            "prompt_name": self.prompt_name,
            "truncate": self.truncate,
            "shard_rows": self.shard_rows,
        }


def resolve_task(task: str, kind: str, is_splade: bool) -> str:
    if task != "auto":
        wanted_embedding = task in ("embed", "sparse")
        if wanted_embedding != (kind == "embedding") or (task == "sparse") != is_splade:
            raise JobError(
                f"--task {task} does not fit this model ({kind}{', SPLADE' if is_splade else ''})"
            )
        return task
    if kind != "embedding":
        return "predict"
    return "sparse" if is_splade else "embed"


def model_fingerprint(folder: Path) -> str:
    """sha256 over the model folder's files (names and contents; files over 64 MiB by their size
    and first and last MiB): two folders with the same fingerprint compute the same vectors."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue
        size = path.stat().st_size
        digest.update(f"{rel}\0{size}\0".encode())
        with path.open("rb") as f:
            if size <= 64 << 20:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
            else:
                digest.update(f.read(1 << 20))
                f.seek(-(1 << 20), 2)
                digest.update(f.read())
    return digest.hexdigest()


def model_record(
    settings: ModelSettings, folder: Path, kind: str, dimension: int
) -> dict[str, Any]:
    if settings.dtype == "auto":
        raise JobError(AUTO_DTYPE)
    record: dict[str, Any] = {name: getattr(settings, name) for name in MODEL_FIELDS}
    record["fingerprint"] = model_fingerprint(folder)
    record["kind"] = kind
    record["dimension"] = dimension
    return record
