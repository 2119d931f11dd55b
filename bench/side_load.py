"""What other work on the same cores costs the model's pass: how often it cuts in, more than
how much CPU it takes.

    python bench/side_load.py [--backend torch] [--dtype bfloat16] [--duty 10] [--periods 2,10,100]

A backend's pass over corpus texts in 32-text batches (bench/breakdown.py's batches),
in-process, on a thread of its own as in the server: alone, and beside a second process that
tokenizes corpus texts for `--duty` percent of every period and sleeps the rest (one core's
share, as a server's event loop and tokenizer threads or a benchmark client take it). The same
share of CPU cut into short slices costs the pass far more than in long ones: the cost is per
interruption (an OpenMP team waits at every op for the thread that was preempted). Rows
alternate over the rounds; each figure is the median. `--backend` compares the runtimes' thread
pools (torch's OpenMP, ONNX Runtime's, OpenVINO's TBB) under the same interruptions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

TEXTS_PER_BATCH = 32


def side(duty: float, period_ms: float) -> None:
    """Tokenize for `duty` of every `period_ms`, sleep the rest; until killed."""
    from bench.corpus import corpus
    from bench.tokens import bench_tokenizer, packaged_model

    tok = bench_tokenizer(packaged_model())
    texts = corpus(600, seed=1)
    busy, rest = duty * period_ms / 1e3, (1 - duty) * period_ms / 1e3
    i = 0
    while True:
        started = time.perf_counter()
        while time.perf_counter() - started < busy:
            tok.encode(texts[i % len(texts)])
            i += 1
        time.sleep(rest)


def measure(
    backend: str, dtype: str, n_texts: int, duty: float, periods: list[float], rounds: int
) -> None:
    from bench.corpus import corpus
    from bench.tokens import bench_tokenizer, packaged_model

    from vectorpress.backends.select import select_backend
    from vectorpress.model_spec import load_model_spec
    from vectorpress.settings import Settings
    from vectorpress.types import Batch, Encoding

    model = packaged_model()
    settings = Settings.single(str(model), backend=backend, dtype=dtype)
    spec = load_model_spec(model, settings.model)
    engine = select_backend(spec, settings.model)
    texts = corpus(n_texts, seed=0)
    encodings = [
        Encoding(ids=e.ids, type_ids=e.type_ids, position_offset=spec.position_offset)
        for e in bench_tokenizer(model).encode_batch(texts)
    ]
    batches = [
        Batch.from_encodings(encodings[i : i + TEXTS_PER_BATCH])
        for i in range(0, len(encodings), TEXTS_PER_BATCH)
    ]
    tokens = sum(b.total_tokens for b in batches)
    for batch in batches[:4]:
        engine.embed(batch)
    rows: list[float | None] = [None, *periods]
    speeds: dict[float | None, list[float]] = {row: [] for row in rows}
    for r in range(rounds):
        for period in rows if r % 2 == 0 else rows[::-1]:
            load = None
            if period is not None:
                load = subprocess.Popen(
                    [sys.executable, __file__, "--side", str(duty), str(period)]
                )
                time.sleep(0.5)  # its imports done (no torch), its cycle running
            started = time.perf_counter()
            for batch in batches:
                engine.embed(batch)
            speeds[period].append(tokens / (time.perf_counter() - started))
            if load is not None:
                load.kill()
                load.wait()
    cores = os.cpu_count() or 1
    alone = statistics.median(speeds[None])
    print(
        f"{cores} CPUs, {engine.name} {engine.dtype}, {n_texts} corpus texts ({tokens:,} "
        f"tokens) in batches of {TEXTS_PER_BATCH}, {rounds} rounds; side work {duty:.0%} of "
        f"one core ({duty / cores:.1%} of the machine)"
    )
    print("| side work | slices | tok/s | of alone |")
    print("|---|---|---|---|")
    for period in rows:
        speed = statistics.median(speeds[period])
        what = "none" if period is None else f"{duty * period:g} ms every {period:g} ms"
        slices = "-" if period is None else f"{1e3 / period:g}/s"
        print(f"| {what} | {slices} | {speed:,.0f} | {speed / alone:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--texts", type=int, default=600)
    ap.add_argument("--duty", type=float, default=10, help="percent of one core")
    ap.add_argument("--periods", default="2,10,100", help="comma-separated, in ms")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--side", nargs=2, type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.side:
        side(args.side[0] / 100, args.side[1])
        return
    periods = [float(p) for p in args.periods.split(",")]
    # The pass on a thread of its own, as the server's model thread runs it.
    worker = threading.Thread(
        target=measure,
        args=(args.backend, args.dtype, args.texts, args.duty / 100, periods, args.rounds),
    )
    worker.start()
    worker.join()


if __name__ == "__main__":
    main()
