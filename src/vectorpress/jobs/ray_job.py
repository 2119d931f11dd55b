"""`vectorpress embed --ray-address`: the same job on a Ray cluster, with Ray Data.

The driver plans the shards exactly as the local job does (each input file cut into runs of
`shard_rows`) and hands the unfinished ones to Ray Data: `map_batches` over an actor class that
holds an `Engine`, with a pool of `--actors` actors of `num_cpus` / `num_gpus` each, spread over the
nodes. Each actor reads its shard's rows with the local job's reader (Parquet seeks to the row
group) and writes the shard through the same code, so the output folder, its manifest and the
resume rules are the local job's: a shard's files are renamed into place and its record written
last, and a shard retried after an actor died overwrites its own files, so every row is in the
output exactly once. (Ray's own `write_parquet` names files by its blocks, which would neither
match the local job's shards nor let a rerun skip what is finished.)
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vectorpress.errors import JobError
from vectorpress.jobs.local import Progress, Summary, finish, header, plan, read_shard
from vectorpress.jobs.manifest import Output, ShardRecord
from vectorpress.jobs.shard import ShardRef, process_shard
from vectorpress.jobs.spec import JobSpec, resolve_task
from vectorpress.model_spec import resolve_model_spec
from vectorpress.settings import ModelSettings

log = logging.getLogger("vectorpress.jobs")


@dataclass(frozen=True)
class RayOptions:
    address: str
    actors: int = 1
    cpus_per_actor: float = 1.0
    gpus_per_actor: float = 0.0
    threads: int | None = None
    """torch threads per actor (default: its CPUs, at least 1)."""


class ShardWorker:
    """One Ray actor: an Engine, and the shards Ray Data hands it one at a time."""

    def __init__(
        self, job: JobSpec, settings: ModelSettings, task: str, threads: int | None
    ) -> None:
        import ray

        from vectorpress.engine import Engine

        self.job = job
        self.task = task
        self.output = Output(job.output)
        self.engine = Engine(settings=settings, threads=threads)
        self.where = f"{ray.get_runtime_context().get_node_id()[:12]}:{os.getpid()}"

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        records = []
        for f, k, first, rows in zip(
            batch["file"], batch["shard"], batch["first_row"], batch["rows"], strict=True
        ):
            ref = ShardRef(int(f), int(k), int(first), int(rows))
            block = read_shard(self.job, ref)
            record = process_shard(
                self.engine, self.job, self.task, ref, block, self.output, self.where
            )
            records.append(json.dumps(asdict(record)))
        return {"record": records}


def run_ray(
    job: JobSpec, settings: ModelSettings, options: RayOptions, progress: str = "auto"
) -> Summary:
    import ray
    from ray.data import DataContext

    if options.actors <= 0:
        raise JobError("--actors must be a positive integer")
    started = time.perf_counter()
    # Actors run elsewhere: every path they see must be absolute.
    job = JobSpec(**{**job.__dict__, "output": str(Path(job.output).resolve()),
                     "inputs": tuple(str(Path(p).resolve()) for p in job.inputs)})  # fmt: skip
    spec = resolve_model_spec(settings)  # the driver loads no weights
    task = resolve_task(job.task, spec.kind, spec.is_splade)
    output = Output(job.output)
    head = header(job, settings, spec, task)
    output.prepare(head)
    refs = plan(job)
    finished = output.finished()
    todo = [r for r in refs if r.name not in finished]
    records = {r.name: r for r in output.records()}
    bar = Progress(
        sum(r.rows for r in refs), sum(r.rows for r in refs if r.name in finished), progress
    )
    written: list[ShardRecord] = []
    if todo:
        ray.init(address=options.address, ignore_reinit_error=True, log_to_driver=False)
        ctx = DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.execution_options.verbose_progress = False
        # Work starts once every actor has loaded its model: otherwise the first one up takes
        # shard after shard while the others load, and the job runs on fewer nodes than asked.
        ctx.wait_for_min_actors_s = 600
        threads = options.threads or max(1, int(options.cpus_per_actor))
        items = [
            {"file": r.file, "shard": r.shard, "first_row": r.first_row, "rows": r.rows}
            for r in todo
        ]
        ds = ray.data.from_items(items, override_num_blocks=len(items)).map_batches(
            ShardWorker,
            fn_constructor_kwargs={
                "job": job, "settings": settings, "task": task, "threads": threads
            },
            batch_size=1,
            # Ray Data spreads the actors over the nodes (its default scheduling).
            compute=ray.data.ActorPoolStrategy(size=options.actors),
            num_cpus=options.cpus_per_actor,
            num_gpus=options.gpus_per_actor or None,
        )  # fmt: skip
        try:
            for row in ds.iter_rows():
                record = ShardRecord.from_dict(json.loads(row["record"]))
                records[record.name] = record
                written.append(record)
                bar.shard(record)
        finally:
            bar.close()
    return finish(output, head, refs, records, written, len(finished), started)
