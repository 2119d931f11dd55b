"""`vectorpress embed` on this machine: the inputs streamed shard by shard through an Engine."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from vectorpress.jobs.inputs import Block, count_rows, file_identity, iter_blocks
from vectorpress.jobs.manifest import FORMAT, Output, ShardRecord
from vectorpress.jobs.shard import ShardRef, process_shard
from vectorpress.jobs.spec import JobSpec, model_record, resolve_task

if TYPE_CHECKING:
    from vectorpress.engine import Engine
    from vectorpress.model_spec import ModelSpec
    from vectorpress.settings import ModelSettings

log = logging.getLogger("vectorpress.jobs")


@dataclass
class Summary:
    rows: int
    rejects: int
    tokens: int
    shards: int
    skipped: int
    seconds: float

    def line(self) -> str:
        rate = self.rows / self.seconds if self.seconds else 0.0
        tps = self.tokens / self.seconds if self.seconds else 0.0
        return (
            f"done: {self.rows:,} rows embedded, {self.rejects:,} rejected, "
            f"{self.tokens:,} tokens in {self.seconds:.1f} s ({rate:,.0f} rows/s, "
            f"{tps:,.0f} tokens/s); {self.shards} shards written, {self.skipped} already done"
        )


def plan(job: JobSpec) -> list[ShardRef]:
    """Every shard of the job: each input file cut into runs of `shard_rows` rows."""
    refs = []
    for f, (path, fmt) in enumerate(zip(job.inputs, job.formats(), strict=True)):
        n = count_rows(Path(path), fmt, job.columns)
        for k, first in enumerate(range(0, n, job.shard_rows)):
            refs.append(ShardRef(f, k, first, min(job.shard_rows, n - first)))
    return refs


def header(job: JobSpec, settings: ModelSettings, spec: ModelSpec, task: str) -> dict[str, Any]:
    """The manifest's account of the job, the same whether it runs here or on Ray."""
    options = job.options()
    options["task"] = task
    return {
        "format": FORMAT,
        "model": model_record(settings, spec.path, spec.kind, spec.embedding_size),
        "options": options,
        "inputs": [file_identity(Path(p)) for p in job.inputs],
    }


def read_shard(job: JobSpec, ref: ShardRef) -> Block:
    """The shard's rows, read from its first row (Parquet skips whole row groups)."""
    path, fmt = Path(job.inputs[ref.file]), job.formats()[ref.file]
    block: Block | None = None
    for part in iter_blocks(path, fmt, job.columns, job.block_rows, start=ref.first_row):
        if block is None:
            block = part
        else:
            block.extend(part)
        if len(block) >= ref.rows:
            break
    assert block is not None, f"{path} has fewer rows than planned"
    return block.slice(0, ref.rows)


def shards(
    job: JobSpec, refs: list[ShardRef], finished: set[str]
) -> Iterator[tuple[ShardRef, Block]]:
    """Each unfinished shard with its rows, every file read once from start to end."""
    by_file: dict[int, list[ShardRef]] = {}
    for ref in refs:
        by_file.setdefault(ref.file, []).append(ref)
    formats = job.formats()
    for f, file_refs in by_file.items():
        todo = [r for r in file_refs if r.name not in finished]
        if not todo:
            continue
        pending: Block | None = None
        position = todo[0].first_row
        blocks = iter_blocks(Path(job.inputs[f]), formats[f], job.columns, job.block_rows, position)
        for ref in todo:
            if ref.first_row > position:  # a finished shard in between: read past it
                skip = ref.first_row - position
                while skip:
                    if pending is None or not len(pending):
                        pending = next(blocks)
                    take = min(skip, len(pending))
                    pending = pending.slice(take, len(pending))
                    skip -= take
                position = ref.first_row
            block = Block([], [] if job.columns.pair else None, [] if job.columns.id else None)
            while len(block) < ref.rows:
                if pending is None or not len(pending):
                    pending = next(blocks)
                take = min(ref.rows - len(block), len(pending))
                block.extend(pending.slice(0, take))
                pending = pending.slice(take, len(pending))
            position += ref.rows
            yield ref, block


class Progress:
    """A bar (rows, tokens/s, ETA) on a terminal; otherwise a log line per shard."""

    def __init__(
        self, total_rows: int, done_rows: int, mode: str = "auto", stream: TextIO | None = None
    ) -> None:
        self.stream = stream or sys.stderr
        self.mode = mode if mode != "auto" else ("bar" if self.stream.isatty() else "log")
        self.total = total_rows
        self.done = done_rows
        self.tokens = 0
        self.started = time.perf_counter()
        self.bar: Any = None
        if self.mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(
                total=total_rows, initial=done_rows, unit="rows", file=self.stream, smoothing=0.1
            )

    def shard(self, record: ShardRecord) -> None:
        self.done += record.input_rows
        self.tokens += record.tokens
        elapsed = time.perf_counter() - self.started
        tps = self.tokens / elapsed if elapsed else 0.0
        if self.bar is not None:
            self.bar.set_postfix_str(f"{tps:,.0f} tok/s, {record.rejects} rejected", refresh=False)
            self.bar.update(record.input_rows)
        elif self.mode == "log":
            log.info(
                "shard %s: %d rows, %d rejected, %d tokens in %.1f s; %d / %d rows, %.0f tokens/s",
                record.name, record.rows, record.rejects, record.tokens, record.seconds,
                self.done, self.total, tps,
            )  # fmt: skip

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_local(job: JobSpec, engine: Engine, progress: str = "auto") -> Summary:
    started = time.perf_counter()
    spec = engine.spec
    task = resolve_task(job.task, spec.kind, spec.is_splade)
    output = Output(job.output)
    head = header(job, engine.settings, spec, task)
    output.prepare(head)
    refs = plan(job)
    finished = output.finished()
    records = {r.name: r for r in output.records()}
    done_rows = sum(r.rows for r in refs if r.name in finished)
    bar = Progress(sum(r.rows for r in refs), done_rows, progress)
    written = []
    try:
        for ref, block in shards(job, refs, finished):
            record = process_shard(engine, job, task, ref, block, output)
            records[record.name] = record
            written.append(record)
            output.write_manifest(head, list(records.values()))
            bar.shard(record)
    finally:
        bar.close()
    return finish(output, head, refs, records, written, len(finished), started)


def finish(
    output: Output,
    head: dict[str, Any],
    refs: list[ShardRef],
    records: dict[str, ShardRecord],
    written: list[ShardRecord],
    skipped: int,
    started: float,
) -> Summary:
    """The last manifest (complete once every planned shard has a record) and the summary; the
    local and the Ray job end alike."""
    complete = all(r.name in records for r in refs)
    output.write_manifest(head, list(records.values()), complete=complete)
    return Summary(
        rows=sum(r.rows for r in written),
        rejects=sum(r.rejects for r in written),
        tokens=sum(r.tokens for r in written),
        shards=len(written),
        skipped=skipped,
        seconds=time.perf_counter() - started,
    )
