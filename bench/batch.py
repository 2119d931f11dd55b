"""Batch embedding: `vectorpress embed` over the benchmark corpus written as Parquet, against a
loop of sentence-transformers `encode` over the same file, and the same job on Ray Data with
one and with two engine actors (a local single-node Ray, loopback only).

Reports rows/s, tokens/s and the share of the fp32 GEMM ceiling that bench/run.py measures (its
own function, on this machine, in the same run). Model loading is not timed; the job's time
includes reading the file, tokenization, writing the Parquet shards and the manifest.

    python bench/batch.py [--quick] [--texts N] [--no-ray]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.corpus import corpus  # noqa: E402
from bench.run import (  # noqa: E402
    RESULTS,
    attended_length,
    flops_per_token,
    gemm_gflops,
    tokenizer_for,
)
from bench.tokens import packaged_model  # noqa: E402


def log(msg: str) -> None:
    print(f"[batch] {msg}", file=sys.stderr, flush=True)


def write_corpus(texts: list[str], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": list(range(len(texts))), "text": texts}), path)
    return path


def st_loop(model: Path, path: Path) -> float:
    """Seconds for sentence-transformers to encode the file, read in record batches."""
    import pyarrow.parquet as pq
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(os.cpu_count() or 1)
    st = SentenceTransformer(str(model), device="cpu")
    st.encode(["warm up"] * 32, batch_size=32)
    started = time.perf_counter()
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1024, columns=["text"]):
        st.encode(batch.column(0).to_pylist(), batch_size=32)
    return time.perf_counter() - started


def job_spec(path: Path, out: Path, shard_rows: int) -> Any:
    from vectorpress.jobs.inputs import Columns
    from vectorpress.jobs.spec import JobSpec

    return JobSpec((str(path),), str(out), Columns("text", None, "id"), shard_rows=shard_rows)


def local_job(model: Path, path: Path, out: Path, shard_rows: int) -> float:
    from vectorpress.engine import Engine
    from vectorpress.jobs.local import run_local

    with Engine(str(model), max_client_batch_size=256) as engine:
        started = time.perf_counter()
        run_local(job_spec(path, out, shard_rows), engine, progress="none")
        return time.perf_counter() - started


def ray_job(model: Path, path: Path, out: Path, shard_rows: int, actors: int) -> float:
    from vectorpress.jobs.ray_job import RayOptions, run_ray
    from vectorpress.settings import ModelSettings

    cpus = max(1, (os.cpu_count() or 1) // actors)
    settings = ModelSettings(str(model), max_client_batch_size=256)
    options = RayOptions("auto", actors=actors, cpus_per_actor=cpus, threads=cpus)
    started = time.perf_counter()
    run_ray(job_spec(path, out, shard_rows), settings, options, progress="none")
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller corpus (about 3 min)")
    ap.add_argument("--texts", type=int, help="corpus size (default 2000, quick 400)")
    ap.add_argument("--no-ray", action="store_true")
    args = ap.parse_args()

    model = packaged_model()
    n = args.texts or (400 if args.quick else 2000)
    texts = corpus(n)
    counts = tokenizer_for(model)(texts)
    tokens = sum(counts)
    config = json.loads((model / "config.json").read_text())
    fpt = flops_per_token(config, attended_length(counts))
    gflops = gemm_gflops("float32") or 0.0
    ceiling = gflops * 1e9 / fpt
    log(
        f"corpus {n} texts, {tokens} tokens; "
        f"fp32 ceiling {gflops:.0f} GFLOP/s = {ceiling:,.0f} tok/s"
    )
    shard_rows = max(50, n // 8)
    runs: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = write_corpus(texts, Path(tmp) / "corpus.parquet")
        runs.append(("sentence-transformers encode loop over the file", st_loop(model, path)))
        log(f"{runs[-1][0]}: {runs[-1][1]:.1f} s")
        runs.append(
            (
                "vectorpress embed (local job)",
                local_job(model, path, Path(tmp) / "local", shard_rows),
            )
        )
        log(f"{runs[-1][0]}: {runs[-1][1]:.1f} s")
        if not args.no_ray:
            # Ray's single-machine mode: every process on 127.0.0.1.
            os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
            os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            import ray

            ray.init(num_cpus=os.cpu_count() or 1, object_store_memory=200_000_000,
                     include_dashboard=False, log_to_driver=False)  # fmt: skip
            try:
                for actors in (1, 2):
                    out = Path(tmp) / f"ray{actors}"
                    seconds = ray_job(model, path, out, shard_rows, actors)
                    runs.append((f"vectorpress embed --ray-address, {actors} actor(s)", seconds))
                    log(f"{runs[-1][0]}: {seconds:.1f} s")
            finally:
                ray.shutdown()

    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Batch embedding",
        "",
        f"{stamp}; all-MiniLM-L6-v2 fp32 on {os.cpu_count()} CPUs (load average "
        f"{os.getloadavg()[0]:.1f}); {n} texts of the benchmark corpus as Parquet, {tokens:,} "
        f"tokens; shards of {shard_rows} rows. fp32 GEMM ceiling {gflops:.0f} GFLOP/s = "
        f"{ceiling:,.0f} tokens/s. Command: `python bench/batch.py {' '.join(sys.argv[1:])}`.",
        "",
        "| run | seconds | rows/s | tokens/s | of fp32 ceiling |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, seconds in runs:
        tps = tokens / seconds
        lines.append(
            f"| {name} | {seconds:.1f} | {n / seconds:,.0f} | {tps:,.0f} | {tps / ceiling:.0%} |"
        )
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "batch.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
