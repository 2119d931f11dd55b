"""One shard of a job, the same code locally and in a Ray actor: check rows, run the engine on
them sorted by length, write them back in input order."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from vectorpress.errors import VectorpressError
from vectorpress.jobs.encodings import encode_dense, encode_sparse
from vectorpress.jobs.inputs import Block, Invalid
from vectorpress.jobs.manifest import Output, ShardRecord, shard_name
from vectorpress.jobs.spec import JobSpec

if TYPE_CHECKING:
    from vectorpress.engine import Engine


@dataclass(frozen=True)
class ShardRef:
    """Rows [first_row, first_row + rows) of input file `file`."""

    file: int
    shard: int
    first_row: int
    rows: int

    @property
    def name(self) -> str:
        return shard_name(self.file, self.shard)


def reject_reason(value: Any) -> str | None:
    if isinstance(value, Invalid):
        return value.reason
    if value is None:
        return "null"
    if not isinstance(value, str):
        return f"not a string ({type(value).__name__})"
    if not value.strip():
        return "empty"
    return None


def _ids_array(ids: list[Any]) -> Any:
    import pyarrow as pa

    try:
        return pa.array(ids)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError):
        # Mixed types across JSON lines: kept as their text.
        return pa.array([None if v is None else str(v) for v in ids], type=pa.string())


def _run(engine: Engine, task: str, job: JobSpec, items: list[Any]) -> tuple[list[Any], list[int]]:
    if task == "embed":
        result = engine.result(
            "embed",
            items,
            normalize=job.normalize,
            truncate=job.truncate,
            prompt_name=job.prompt_name,
            dimensions=job.dimensions,
        )
    elif task == "sparse":
        result = engine.result(
            "embed_sparse", items, truncate=job.truncate, prompt_name=job.prompt_name
        )
    else:
        result = engine.result("predict", items, truncate=job.truncate)
    return list(result.values), result.lengths


def _run_all(
    engine: Engine, task: str, job: JobSpec, items: list[Any]
) -> tuple[list[Any], list[int], dict[int, str]]:
    """Values and token counts for every item; an item the pipeline refuses (too long with
    truncation off, over the character limit) becomes a reject instead of failing the rest."""
    if not items:
        return [], [], {}
    try:
        values, lengths = _run(engine, task, job, items)
        return values, lengths, {}
    except VectorpressError:
        pass
    values, lengths, failed = [None] * len(items), [0] * len(items), {}
    for i, item in enumerate(items):
        try:
            (value,), (n,) = _run(engine, task, job, [item])
        except VectorpressError as exc:
            failed[i] = exc.message
            continue
        values[i], lengths[i] = value, n
    return values, lengths, failed


def process_shard(
    engine: Engine,
    job: JobSpec,
    task: str,
    ref: ShardRef,
    block: Block,
    output: Output,
    worker: str | None = None,
) -> ShardRecord:
    import pyarrow as pa

    started = time.perf_counter()
    good: list[int] = []
    rejects: list[dict[str, Any]] = []
    ids = block.ids

    def reject(i: int, reason: str) -> None:
        rejects.append(
            {"row": ref.first_row + i, "id": None if ids is None else ids[i], "reason": reason}
        )

    for i, text in enumerate(block.texts):
        reason = reject_reason(text)
        if reason is None and block.pairs is not None:
            pair_reason = reject_reason(block.pairs[i])
            reason = None if pair_reason is None else f"pair: {pair_reason}"
        if reason is None:
            good.append(i)
        else:
            reject(i, reason)

    def size(i: int) -> int:
        return len(block.texts[i]) + (len(block.pairs[i]) if block.pairs is not None else 0)

    # Similar lengths batch together with little padding and few passes per batch.
    order = sorted(good, key=size)
    items: list[Any] = (
        [block.texts[i] for i in order]
        if block.pairs is None
        else [(block.texts[i], block.pairs[i]) for i in order]
    )
    sorted_values, sorted_lengths, failed = _run_all(engine, task, job, items)
    by_row: dict[int, tuple[Any, int]] = {}
    for k, i in enumerate(order):
        if k in failed:
            reject(i, failed[k])
        else:
            by_row[i] = (sorted_values[k], sorted_lengths[k])
    rows = sorted(by_row)
    rejects.sort(key=lambda r: r["row"])

    columns: dict[str, Any] = {"row": pa.array([ref.first_row + i for i in rows], type=pa.int64())}
    if ids is not None:
        columns[job.columns.id or "id"] = _ids_array([ids[i] for i in rows])
    columns["tokens"] = pa.array([by_row[i][1] for i in rows], type=pa.int32())
    values = [by_row[i][0] for i in rows]
    if task == "embed":
        dim = job.dimensions or engine.dimension
        matrix = np.stack(values) if values else np.zeros((0, dim), dtype=np.float32)
        columns["embedding"] = encode_dense(matrix, job.encoding)
    elif task == "sparse":
        columns["sparse"] = encode_sparse(values)
    else:
        columns["label"] = pa.array([v[0][0] for v in values], type=pa.string())
        columns["score"] = pa.array([v[0][1] for v in values], type=pa.float32())
    table = pa.table(columns)
    record = ShardRecord(
        name=ref.name,
        file=ref.file,
        shard=ref.shard,
        first_row=ref.first_row,
        input_rows=len(block),
        rows=len(rows),
        rejects=len(rejects),
        tokens=int(sum(by_row[i][1] for i in rows)),
        seconds=round(time.perf_counter() - started, 3),
        worker=worker or f"{socket.gethostname()}:{os.getpid()}",
    )
    output.write_shard(ref.name, table, rejects, record)
    return record
