"""vectorpress over HTTP on a GPU: the real server, the benchmark client, the corpus. Run by
bench/gpu.sh after gpu_check.py (which times the bare backend in-process).

    python bench/gpu_serve.py [TEXTS] [--dtypes float16,bfloat16,float32] [--out FILE] [--trace]
        [--serve-args '--cuda-graphs false']

For each dtype, starts `vectorpress serve --device cuda --dtype D` on the packaged
all-MiniLM-L6-v2 and drives it with bench/run.py's client: the corpus as one-text requests with
64 in flight, then as 32-text requests with 4 and with 16 in flight, then the short query alone.
Reports tokens/s, the device thread's idle share under each load (how much of the wall time the
GPU's thread waited on tokenization, batching and the answers) and the texts per batch it ran
(te_batch_next_size), the lowest cosine of the served vectors to sentence-transformers' float32
vectors on the same GPU, the short query's p50 and the server's overhead on it (HTTP p50 minus
the server's own inference time), and the time from start to healthy. With --trace, the server
runs through bench/embed_trace.py and each load also reports a pass's mean wall time and its
thread's CPU time in the server, every thread's CPU and the lines the device thread spent its
wall time on (sampled every millisecond: running, or waiting for the interpreter lock). Exits
non-zero when a request fails or a cosine falls under its bound.

VP_DEVICE=cpu runs the same script on a CPU, to check the script itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.client import free_port, inference_seconds, metric_sums, server_overhead  # noqa: E402
from bench.corpus import corpus  # noqa: E402
from bench.embed_trace import SAMPLE_DUMP, sample_delta  # noqa: E402
from bench.run import (  # noqa: E402
    Server,
    accuracy,
    drive,
    log,
    pct,
    short_query_latencies,
    tokenizer_for,
    vectorpress_cmd,
)
from bench.tokens import packaged_model  # noqa: E402

#: The sum and count of the texts in each batch the server ran.
BATCHES = ("te_batch_next_size_sum", "te_batch_next_size_count")
#: Lowest cosine to sentence-transformers' float32 vectors, per served dtype.
BOUND = {"float32": 0.99999, "float16": 0.999, "bfloat16": 0.995}


def reference(model: Path, texts: list[str], device: str) -> np.ndarray:
    """sentence-transformers' float32 vectors of `texts` on `device`; its memory freed after."""
    import torch
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model), device=device)
    vectors = np.asarray(st.encode(texts, batch_size=64), dtype=np.float64)
    del st
    if device == "cuda":
        torch.cuda.empty_cache()
    return vectors


def passes(trace: Path | None) -> list[tuple[int, float, float]]:
    """The passes bench/embed_trace.py has recorded so far: (texts, wall s, CPU s)."""
    if trace is None or not trace.exists():
        return []
    rows = (line.split() for line in trace.read_text().splitlines() if line)
    return [(int(n), float(wall), float(cpu)) for n, wall, cpu in rows]


def snapshot(trace: Path | None) -> dict[str, Any]:
    """The sampler's latest totals (bench/embed_trace.py), after its next write."""
    if trace is None:
        return {}
    time.sleep(2 * SAMPLE_DUMP)
    path = trace.with_suffix(".sample.json")
    return json.loads(path.read_text()) if path.exists() else {}


def report_sample(name: str, delta: dict[str, Any]) -> None:
    wall = delta["wall_s"]
    log(f"  {name}: CPU by thread over {wall:.1f} s (cores busy):")
    for thread, cpu in delta["threads"][:8]:
        log(f"    {cpu / wall:5.2f}  {thread}")
    log("  the device thread's lines by wall time (share of wall, of it running):")
    for stack, w, c in delta["stacks"]:
        log(f"    {w / wall:6.1%} {c / w if w else 0:6.1%}  {stack}")


def measure(
    model: Path,
    dtype: str,
    device: str,
    texts: list[str],
    counts: list[int],
    ref: np.ndarray,
    trace: Path | None = None,
    serve_args: tuple[str, ...] = (),
) -> dict[str, Any]:
    port = free_port()
    cmd = vectorpress_cmd(model, port, "--device", device, "--dtype", dtype, *serve_args)
    env = {}
    if trace is not None:
        # The same command through the tracing launcher: `python bench/embed_trace.py serve ...`
        cmd = [sys.executable, str(ROOT / "bench" / "embed_trace.py"), *cmd[3:]]
        env["VP_EMBED_TRACE"] = str(trace)
        env["VP_EMBED_SAMPLE"] = str(trace.with_suffix(".sample.json"))
    server = Server(f"vectorpress {dtype}", cmd, port, "vp", env)
    out: dict[str, Any] = {"dtype": dtype, "load": {}}
    try:
        t = time.perf_counter()
        server.wait()
        out["start_s"] = time.perf_counter() - t
        singles = [server.payload([x]) for x in texts]
        starts = range(0, len(texts), 32)
        batches = [server.payload(texts[i : i + 32]) for i in starts]
        batch_counts = [sum(counts[i : i + 32]) for i in starts]
        # Warm-up: lazy allocations and the first kernels of each shape happen off the clock.
        asyncio.run(drive(server, singles[:256], counts[:256], 16))
        asyncio.run(drive(server, batches[:16], batch_counts[:16], 4))
        bodies: list[bytes] = [b""] * len(texts)
        loads = {
            "1x64": (singles, counts, 64, bodies),
            "32x4": (batches, batch_counts, 4, None),
            "32x16": (batches, batch_counts, 16, None),
        }
        for name, (requests, tokens, concurrency, keep) in loads.items():
            before_batches = metric_sums(server.url, BATCHES)
            traced = len(passes(trace))
            sampled = snapshot(trace)
            figures = asyncio.run(drive(server, requests, tokens, concurrency, keep))
            if sampled and (after := snapshot(trace)):
                figures["sample"] = sample_delta(sampled, after)
                report_sample(f"{dtype} {name}", figures["sample"])
            texts_, count = (
                b - a for a, b in zip(before_batches, metric_sums(server.url, BATCHES), strict=True)
            )
            figures["texts_per_batch"] = texts_ / count if count else math.nan
            if during := passes(trace)[traced:]:
                figures["pass_wall_ms"] = 1e3 * sum(p[1] for p in during) / len(during)
                figures["pass_cpu_ms"] = 1e3 * sum(p[2] for p in during) / len(during)
            out["load"][name] = figures
        out["cos_min"], out["cos_mean"] = accuracy(server, bodies, ref)
        short_query_latencies(server, 20)
        before = inference_seconds(server.url)
        lat = short_query_latencies(server, 200)
        out["short_p50_ms"] = pct(lat, 0.5) * 1e3
        out["short_p99_ms"] = pct(lat, 0.99) * 1e3
        out["overhead_ms"] = server_overhead(lat, server.url, before) * 1e3
        for name, figures in out["load"].items():
            traced_ = ""
            if "pass_wall_ms" in figures:
                traced_ = (
                    f"; a pass {figures['pass_wall_ms']:.2f} ms wall, "
                    f"{figures['pass_cpu_ms']:.2f} ms of its thread's CPU"
                )
            log(f"  {dtype} {name}: {figures['tokens_per_s']:,.0f} tok/s{traced_}")
    except Exception as exc:  # one dtype failing must not lose the others' figures
        log(f"{dtype} failed: {exc}; the server's log: {server.log.name}")
        out["error"] = str(exc)
        with open(server.log.name, errors="replace") as f:
            print(f.read()[-4000:], flush=True)
    finally:
        server.stop()
    return out


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| dtype | start s | 1-text x 64 tok/s (idle, texts/batch) | 32-text x 4 | 32-text x 16 "
        "| min cosine to ST fp32 (bound) | short query p50 ms | overhead ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['dtype']} | failed: {r['error']} |||||||")
            continue
        cells = []
        for load in ("1x64", "32x4", "32x16"):
            f = r["load"][load]
            idle = f.get("device_idle", math.nan)
            cells.append(f"{f['tokens_per_s']:,.0f} ({idle:.0%}, {f['texts_per_batch']:.1f})")
        lines.append(
            f"| {r['dtype']} | {r['start_s']:.1f} | {' | '.join(cells)} | "
            f"{r['cos_min']:.6f} ({BOUND[r['dtype']]}) | {r['short_p50_ms']:.2f} | "
            f"{r['overhead_ms']:.2f} |"
        )
    traced = [(r["dtype"], n, f) for r in rows for n, f in r["load"].items() if "pass_wall_ms" in f]
    if traced:
        lines += ["", "| dtype | load | a pass in the server, wall ms | its thread's CPU ms |"]
        lines.append("|---|---|---|---|")
        for dtype, name, f in traced:
            lines.append(f"| {dtype} | {name} | {f['pass_wall_ms']:.2f} | {f['pass_cpu_ms']:.2f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("texts", nargs="?", type=int, default=4000)
    ap.add_argument("--dtypes", default="float16,bfloat16,float32")
    ap.add_argument("--out", type=Path, help="also write the figures here as JSON")
    ap.add_argument(
        "--serve-args",
        default="",
        help="more flags for each server, as one string (e.g. '--cuda-graphs false')",
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="time each pass in the server, wall and CPU (bench/embed_trace.py)",
    )
    args = ap.parse_args()
    device = os.environ.get("VP_DEVICE", "cuda")
    model = packaged_model()
    texts = corpus(args.texts)
    counts = tokenizer_for(model)(texts)
    log(f"{device}: {len(texts)} texts, {sum(counts)} tokens; reference vectors")
    ref = reference(model, texts, device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in args.dtypes.split(","):
            log(f"vectorpress --device {device} --dtype {dtype}")
            trace = Path(tmp) / f"{dtype}.trace" if args.trace else None
            serve_args = tuple(args.serve_args.split())
            rows.append(measure(model, dtype, device, texts, counts, ref, trace, serve_args))
    print("\n".join(table(rows)), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    ok = all(
        "error" not in r
        and r["cos_min"] >= BOUND[r["dtype"]]
        and not any(f["errors"] for f in r["load"].values())
        for r in rows
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
