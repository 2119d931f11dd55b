"""Soak: minutes of mixed load against a real server process; reports memory growth, errors and
latency percentiles.

    .venv/bin/python bench/soak.py --minutes 10

Traffic: every route an embedding model serves, about 5% deliberately bad requests (which must
get 4xx) and about 3% clients that disconnect mid-request. Once a minute the load pauses for a
few seconds and resident memory is read at rest (nothing in flight, heap trimmed): growth
compares that reading at the end of the warm-up (`--warmup-minutes`) with the one at the end,
with a fitted trend. Memory under load (sampled every second) is reported beside it. Not a CI
test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.client import free_port  # noqa: E402
from tests.helpers.texts import mixed_texts  # noqa: E402

from vectorpress.core.heap import REST_S  # noqa: E402


def percentile(sorted_values: list[float], p: float) -> str:
    if not sorted_values:
        return "-"
    value = sorted_values[min(len(sorted_values) - 1, int(p * len(sorted_values)))]
    return f"{value * 1000:.1f}"


def good_request(rng: random.Random, texts: list[str]) -> tuple[str, str, object]:
    text = rng.choice(texts)
    batch = rng.sample(texts, rng.randint(2, 16))
    choices: list[tuple[str, str, object]] = [
        ("embed", "/embed", {"inputs": text}),
        ("embed_batch", "/embed", {"inputs": batch}),
        ("embed_all", "/embed_all", {"inputs": text[:200]}),
        (
            "similarity",
            "/similarity",
            {"inputs": {"source_sentence": text, "sentences": batch[:4]}},
        ),
        ("openai", "/v1/embeddings", {"input": batch, "model": "soak"}),
        ("tokenize", "/tokenize", {"inputs": text}),
        ("decode", "/decode", {"ids": [101, 7592, 2088, 102]}),
        ("info", "/info", None),
        ("health", "/health", None),
        ("metrics", "/metrics", None),
    ]
    weights = [30, 20, 5, 8, 15, 6, 4, 4, 4, 4]
    return rng.choices(choices, weights)[0]


BAD_REQUESTS: list[tuple[str, object, bytes | None]] = [
    ("/embed", {"inputs": ""}, None),
    ("/embed", {"inputs": ["x"] * 1000}, None),
    ("/embed", {"inputs": "x", "dimensions": 0}, None),
    ("/embed", None, b'{"inputs": '),
    ("/v1/embeddings", {"input": 3}, None),
    ("/rerank", {"query": "q", "texts": ["a"]}, None),
    ("/decode", {"ids": []}, None),
]


async def run(args: argparse.Namespace) -> int:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vectorpress",
            "serve",
            "--hostname",
            "127.0.0.1",
            "--port",
            str(port),
            "--max-concurrent-requests",
            str(args.permits),
            *(["--dtype", args.dtype] if args.dtype else []),
            *(["--backend", args.backend] if args.backend else []),
        ],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    proc = psutil.Process(server.pid)
    try:
        async with httpx.AsyncClient(timeout=60) as probe:
            for _ in range(600):
                try:
                    if (await probe.get(f"{url}/health")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.2)
        texts = mixed_texts(2000, seed=7)
        duration = args.minutes * 60
        started_at = time.monotonic()
        warmup_end = started_at + args.warmup_minutes * 60
        stop_at = time.monotonic() + duration
        latencies: dict[str, list[float]] = defaultdict(list)
        statuses: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
        unexpected: list[str] = []
        counts = {"requests": 0, "bad": 0, "disconnects": 0}
        rss: list[tuple[float, int]] = []
        resting: list[tuple[float, int]] = []
        running = asyncio.Event()
        running.set()
        in_flight = 0

        async def sampler() -> None:
            while time.monotonic() < stop_at:
                rss.append((time.monotonic(), proc.memory_info().rss))
                await asyncio.sleep(1.0)

        async def rest_sample() -> None:
            """Resident memory with nothing in flight: the load pauses, one short request
            still answers, the device trims its heap once it has rested (`REST_S`), and what
            is left is what the server retains."""
            running.clear()
            deadline = time.monotonic() + 60
            while in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            async with httpx.AsyncClient(timeout=60) as http:
                r = await http.post(f"{url}/embed", json={"inputs": "resting"})
                if r.status_code != 200:
                    unexpected.append(f"rest probe -> {r.status_code}")
            await asyncio.sleep(REST_S + 0.5)
            resting.append((time.monotonic(), proc.memory_info().rss))
            running.set()

        async def rest_sampler() -> None:
            while (wait := started_at + 60 * (len(resting) + 1) - time.monotonic()) > 0 and (
                time.monotonic() + wait < stop_at
            ):
                await asyncio.sleep(wait)
                await rest_sample()

        async def worker(seed: int) -> None:
            nonlocal in_flight
            rng = random.Random(seed)
            async with httpx.AsyncClient(timeout=120) as http:
                while time.monotonic() < stop_at:
                    await running.wait()
                    in_flight += 1
                    try:
                        await one(rng, http)
                    finally:
                        in_flight -= 1

        async def one(rng: random.Random, http: httpx.AsyncClient) -> None:
            roll = rng.random()
            if roll < 0.05:
                path, payload, raw = rng.choice(BAD_REQUESTS)
                counts["bad"] += 1
                r = await (
                    http.post(
                        f"{url}{path}",
                        content=raw,
                        headers={"content-type": "application/json"},
                    )
                    if raw is not None
                    else http.post(f"{url}{path}", json=payload)
                )
                statuses["bad"][r.status_code] += 1
                if not 400 <= r.status_code < 500:
                    unexpected.append(f"bad {path} -> {r.status_code}")
                return
            name, path, payload = good_request(rng, texts)
            if roll < 0.08 and payload is not None:
                counts["disconnects"] += 1
                task = asyncio.ensure_future(http.post(f"{url}{path}", json=payload))
                await asyncio.sleep(rng.uniform(0.0, 0.05))
                task.cancel()
                return
            started = time.perf_counter()
            r = await (
                http.get(f"{url}{path}")
                if payload is None
                else http.post(f"{url}{path}", json=payload)
            )
            counts["requests"] += 1
            statuses[name][r.status_code] += 1
            if r.status_code == 200:
                latencies[name].append(time.perf_counter() - started)
            elif r.status_code != 429:
                unexpected.append(f"{name} -> {r.status_code}: {r.text[:100]}")

        await asyncio.gather(sampler(), rest_sampler(), *(worker(i) for i in range(args.clients)))
        await rest_sample()
        # Under load, resident memory swings by a fifth from one second to the next with the
        # batches in flight (a 16,384-token batch holds hundreds of MiB of activations) and the
        # last heap trim, and a minute's mean still swings by a tenth. Growth is therefore read
        # at rest, once a minute: what the server keeps once its work is done. The figures
        # under load are reported beside it.
        rest_after = [(t, m) for t, m in resting if t >= warmup_end] or resting[-1:]
        rest_base, rest_end = rest_after[0][1], rest_after[-1][1]
        rest_growth = (rest_end - rest_base) / rest_base * 100
        rest_slope = _slope(rest_after) * 60 / 2**20
        after_warmup = [(t, m) for t, m in rss if t >= warmup_end] or rss[-1:]
        per_minute = [m for i, (t, m) in enumerate(rss) if i % 60 == 0]
        t0, t1 = after_warmup[0][0], after_warmup[-1][0]
        first = [m for t, m in after_warmup if t < t0 + 60]
        last = [m for t, m in after_warmup if t > t1 - 60]
        base, end = sum(first) / len(first), sum(last) / len(last)
        peak = max(m for _, m in after_warmup)
        growth = (end - base) / base * 100
        slope = _slope(after_warmup) * 60 / 2**20
        # Allocator settings change the memory figure, so the report names them.
        command = [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")]
        command += [Path(sys.executable).name, "bench/soak.py", *sys.argv[1:]]
        lines = [
            f"# Soak, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC",
            "",
            f"`{' '.join(command)}`: "
            f"{args.minutes} min, {args.clients} clients, --max-concurrent-requests "
            f"{args.permits}, all-MiniLM-L6-v2 ({args.dtype or 'default dtype'}, "
            f"{args.backend or 'default'} backend), "
            f"{os.cpu_count()} cores.",
            "",
            f"- requests: {counts['requests']}, deliberately bad: {counts['bad']}, "
            f"disconnects: {counts['disconnects']}",
            f"- resident memory at rest (load paused, heap trimmed), from the end of the "
            f"warm-up to the end: {rest_base / 2**20:.1f} MiB -> {rest_end / 2**20:.1f} MiB, "
            f"growth {rest_growth:+.2f}% (target < 5%); fitted trend {rest_slope:+.1f} MiB/min",
            "- resident memory at rest each minute (MiB): "
            + ", ".join(f"{m / 2**20:.0f}" for _, m in resting),
            f"- under load, mean of the first minute after warm-up -> mean of the last minute: "
            f"{base / 2**20:.1f} MiB -> {end / 2**20:.1f} MiB (peak {peak / 2**20:.1f} MiB), "
            f"{growth:+.2f}%; fitted trend {slope:+.1f} MiB/min",
            "- under load, one sample each minute (MiB): "
            + ", ".join(f"{m / 2**20:.0f}" for m in per_minute),
            f"- errors other than 429 and the expected 4xx: {len(unexpected)} (target 0)",
            "",
            "| route | ok | p50 ms | p90 ms | p99 ms | statuses |",
            "|---|---|---|---|---|---|",
        ]
        for name in sorted(statuses):
            lat = sorted(latencies.get(name, []))
            p50, p90, p99 = (percentile(lat, p) for p in (0.5, 0.9, 0.99))
            lines.append(
                f"| {name} | {len(lat)} | {p50} | {p90} | {p99} | {dict(statuses[name])} |"
            )
        if unexpected:
            lines += ["", "Unexpected:", *[f"- {u}" for u in unexpected[:20]]]
        report = "\n".join(lines) + "\n"
        print(report)
        # One history file rather than a file per run; each run is a section named by its time.
        out = ROOT / "bench" / "results" / "soak-history.md"
        out.parent.mkdir(parents=True, exist_ok=True)
        name = f"soak-{datetime.now(timezone.utc):%Y%m%d-%H%M}"
        demoted = "\n".join("#" + ln if ln.startswith("#") else ln for ln in report.splitlines())
        with out.open("a") as f:
            f.write(f"\n## {name}\n\n{demoted}\n")
        print(f"added as {name} to {out.relative_to(ROOT)}")
        return 0 if not unexpected and rest_growth < 5 else 1
    finally:
        server.terminate()
        server.wait(60)


def _slope(points: list[tuple[float, int]]) -> float:
    """Least-squares slope of memory over time, bytes per second."""
    n = len(points)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in points) / n
    mm = sum(m for _, m in points) / n
    var = sum((t - mt) ** 2 for t, _ in points)
    return sum((t - mt) * (m - mm) for t, m in points) / var if var else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    # Resident memory climbs for the first minutes while every batch shape is met for the
    # first time (a fixed-shape load stays flat from the start), so growth counts from here.
    parser.add_argument("--warmup-minutes", type=float, default=3.0)
    parser.add_argument("--clients", type=int, default=24)
    parser.add_argument("--permits", type=int, default=64)
    parser.add_argument("--dtype", help="the server's --dtype (default: its own)")
    parser.add_argument("--backend", help="the server's --backend (default: its own)")
    return asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    raise SystemExit(main())
