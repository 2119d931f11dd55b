"""Queries against bulk ingestion: the interactive lane, the scheduler across models, one process
against two.

`python bench/lanes.py [--seconds 20] [--parts single,two,split]`, on the bundled
all-MiniLM-L6-v2 (fp32, CPU). Each server runs in its own process; the clients (bench/client.py,
one kept-alive connection each) run in this one.

- single: four clients post 32 passages of about 1,200 characters in a loop; a fifth sends a
  one-sentence /embed one at a time. The query's p50/p99, and the bulk clients' passages/s with
  and without the queries, for: the lanes with preemption between layers (the default), the
  lanes with bulk units only (--preemption false), and the query sent as bulk (what a FIFO
  queue gives it, as before the lanes).
- two: one process serving the embedder and a cross-encoder (--model-id twice); the embedder
  flooded as above, /rerank queries of 20 passages to the cross-encoder; rerank p99 against its
  idle p99.
- split: the embedder and the cross-encoder in one process against one process each, under the
  same load (two clients of 32-passage /embed, two of 20-passage /rerank): total throughput and
  resident memory.

The cross-encoder is all-MiniLM-L6-v2's encoder under a fresh one-logit head
(BertForSequenceClassification): a real model's size and speed, no real scores (none is
installable from a package registry). Timings on a shared machine are indicative.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client import Connection, free_port, wait_healthy
from corpus import sentences

ROOT = Path(__file__).resolve().parents[1]
QUERY = "How do I configure logging for a small web service?"


def pct(values: Sequence[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def passages(n: int, chars: int, seed: int) -> list[str]:
    pool = sentences()
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        text = ""
        while len(text) < chars:
            text += rng.choice(pool) + " "
        out.append(text[:chars])
    return out


class Server:
    """`vectorpress serve ARGS` in its own process, ready once /health answers 200."""

    def __init__(self, args: list[str], src: Path = ROOT / "src") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(src)}
        # Its log to a file: a pipe nobody reads fills up under load and stalls the server.
        self.log = tempfile.NamedTemporaryFile(prefix="lanes-", suffix=".log", delete=False)  # noqa: SIM115 (open for the life of the process)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vectorpress", "serve", "--port", str(self.port), *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        wait_healthy("server", self.url, self.proc, self.log.name, timeout=600, poll=0.5)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Load:
    """What the clients of one phase did."""

    seconds: float = 0.0
    items: dict[str, int] = field(default_factory=dict)
    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0
    answers: dict[str, list[list[float]]] = field(default_factory=dict)
    """Per client of each name, when each of its answers came during the phase."""
    per_answer: dict[str, int] = field(default_factory=dict)

    def rate(self, name: str) -> float:
        """Items per second of `name`'s clients, summed: each client's answers over the time
        from its first answer in the phase to its last. A bulk answer takes seconds, so
        counting the requests that start in the phase would move the rate by a whole request
        per client (about 6% of a 20 s phase) on where the phase's edges fall."""
        total, timed = 0.0, 0
        for times in self.answers.get(name, []):
            if len(times) >= 2 and times[-1] > times[0]:
                total += (len(times) - 1) * self.per_answer[name] / (times[-1] - times[0])
                timed += 1
        # A client with fewer than two answers in the phase has no rate: the phase was too
        # short for the machine (run longer), not a rate of zero.
        return total if timed == len(self.answers.get(name, [])) and timed else float("nan")


@dataclass(frozen=True)
class Client:
    """A client that sends `body` to `path` in a loop; `items` counted per answer; `timed`
    records each answer's latency; `pause` seconds between requests."""

    name: str
    url: str
    path: str
    body: dict[str, object]
    items: int
    timed: bool = False
    pause: float = 0.0


async def run_load(clients: Sequence[Client], seconds: float, warm: float = 2.0) -> Load:
    load = Load()
    start = time.perf_counter() + warm
    stop = start + seconds

    async def loop(c: Client) -> None:
        conn = Connection(c.url)
        answers: list[float] = []
        load.answers.setdefault(c.name, []).append(answers)
        load.per_answer[c.name] = c.items
        try:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                status, _ = await conn.post(c.path, c.body)
                t1 = time.perf_counter()
                if status != 200:
                    load.errors += 1
                elif start <= t1 <= stop:
                    answers.append(t1)
                if status == 200 and t0 >= start:
                    load.items[c.name] = load.items.get(c.name, 0) + c.items
                    if c.timed:
                        load.latencies.setdefault(c.name, []).append(t1 - t0)
                if c.pause:
                    await asyncio.sleep(c.pause)
        finally:
            await conn.close()

    await asyncio.gather(*(loop(c) for c in clients))
    load.seconds = seconds
    return load


def bulk_clients(url: str, docs: list[str], n: int = 4, model: str | None = None) -> list[Client]:
    out = []
    for i in range(n):
        body: dict[str, object] = {"inputs": docs[i * 32 : (i + 1) * 32]}
        if model:
            body["model"] = model
        out.append(Client("bulk", url, "/embed", body, 32))
    return out


def row(*cells: object) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def ms(v: float) -> str:
    return f"{v * 1000:,.0f}"


#: The single part's servers, as --variants names them.
VARIANTS = ("preempt", "units", "fifo", "one-runner")


def part_single(
    model: str, seconds: float, baseline: Path | None, chosen: Sequence[str] = VARIANTS
) -> list[str]:
    docs = passages(128, 1200, seed=1)
    query = Client("query", "", "/embed", {"inputs": QUERY}, 1, timed=True, pause=0.05)
    lines = [
        "### One model: a one-sentence query while four clients post 32 passages",
        "",
        row("server", "query p50 ms", "query p99 ms", "query max ms", "queries/s",
            "bulk passages/s",
            "bulk alone passages/s", "bulk kept"),
        row(*["---"] * 8),
    ]  # fmt: skip
    here = ROOT / "src"
    variants = [
        ("lanes, preemption between layers", [], {}, here),
        ("lanes, bulk units only", ["--preemption", "false"], {}, here),
        ("query sent as bulk (FIFO)", [], {"priority": "bulk"}, here),
        ("lanes, preemption, one unit at a time", ["--device-runners", "1"], {}, here),
    ]
    variants = [v for key, v in zip(VARIANTS, variants, strict=True) if key in chosen]
    if baseline is not None:
        variants.append((f"before the lanes ({baseline})", [], {}, baseline))
    for name, flags, extra, src in variants:
        srv = Server(["--model-id", model, *flags], src)
        try:
            idle = asyncio.run(
                run_load([Client("query", srv.url, "/embed", {"inputs": QUERY}, 1, True)], 5, 1)
            )
            q = Client(
                query.name, srv.url, query.path, {**query.body, **extra}, 1, True, query.pause
            )
            # Alone and with queries in turn, twice (A/B/A/B), so that a change in the
            # machine's other load weighs on both alike.
            alones, mixeds = [], []
            for _ in range(2):
                alones.append(asyncio.run(run_load(bulk_clients(srv.url, docs), seconds / 2)))
                mixeds.append(asyncio.run(run_load([*bulk_clients(srv.url, docs), q], seconds / 2)))
        finally:
            srv.stop()
        lat = [v for m in mixeds for v in m.latencies.get("query", [])]
        alone_rate = sum(a.rate("bulk") for a in alones) / len(alones)
        mixed_rate = sum(m.rate("bulk") for m in mixeds) / len(mixeds)
        kept = mixed_rate / alone_rate if alone_rate else float("nan")
        errors = sum(x.errors for x in (*alones, *mixeds))
        lines.append(
            row(name, ms(pct(lat, 50)), ms(pct(lat, 99)), ms(max(lat, default=float("nan"))),
                f"{len(lat) / seconds:.1f}", f"{mixed_rate:.1f}", f"{alone_rate:.1f}",
                f"{kept:.0%}")
        )  # fmt: skip
        print(f"{name}: idle query p50 {ms(pct(idle.latencies['query'], 50))} ms, "
              f"{len(lat)} queries under load, {errors} errors",
              flush=True)  # fmt: skip
    return lines


def make_cross_encoder(minilm: str, dest: Path) -> Path:
    """all-MiniLM-L6-v2's encoder under a fresh one-logit classification head."""
    import shutil

    import torch
    from transformers import BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification.from_pretrained(minilm, num_labels=1)
    model.save_pretrained(dest)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
        if (Path(minilm) / name).exists():
            shutil.copy(Path(minilm) / name, dest / name)
    return dest


def two_models(model: str, reranker: Path) -> list[str]:
    """One process serving both; `model` in a body routes to each by its served name."""
    return [
        *("--model-id", model, "--model-id", str(reranker)),
        *("--served-model-name", "embedder", "--served-model-name", "reranker"),
    ]


def rerank_body(texts: list[str], model: str | None = None) -> dict[str, object]:
    body: dict[str, object] = {"query": QUERY, "texts": texts}
    if model:
        body["model"] = model
    return body


def part_two(model: str, reranker: Path, seconds: float) -> list[str]:
    docs = passages(128, 1200, seed=1)
    texts = passages(20, 300, seed=2)
    srv = Server(two_models(model, reranker))
    try:
        rr = Client("rerank", srv.url, "/rerank", rerank_body(texts, "reranker"), 1, True, 0.05)
        idle = asyncio.run(run_load([rr], seconds / 2))
        alone = asyncio.run(run_load(bulk_clients(srv.url, docs, model="embedder"), seconds))
        mixed = asyncio.run(run_load([*bulk_clients(srv.url, docs, model="embedder"), rr], seconds))
    finally:
        srv.stop()
    idle_p99 = pct(idle.latencies.get("rerank", []), 99)
    lat = mixed.latencies.get("rerank", [])
    return [
        "### Two models in one process: the embedder flooded, /rerank of 20 passages",
        "",
        row("rerank idle p50 ms", "idle p99 ms", "under flood p50 ms", "p99 ms", "p99 / idle p99",
            "bulk passages/s", "bulk alone passages/s"),
        row(*["---"] * 7),
        row(ms(pct(idle.latencies.get("rerank", []), 50)), ms(idle_p99), ms(pct(lat, 50)),
            ms(pct(lat, 99)), f"{pct(lat, 99) / idle_p99:.1f}x", f"{mixed.rate('bulk'):.1f}",
            f"{alone.rate('bulk'):.1f}"),
    ]  # fmt: skip


def part_split(model: str, reranker: Path, seconds: float) -> list[str]:
    docs = passages(64, 1200, seed=1)
    texts = passages(20, 300, seed=2)

    def clients(embed_url: str, rerank_url: str, named: bool) -> list[Client]:
        # Everything bulk: the comparison is of throughput, not of the lanes.
        out = [
            Client(c.name, c.url, c.path, {**c.body, "priority": "bulk"}, c.items)
            for c in bulk_clients(embed_url, docs, 2, "embedder" if named else None)
        ]
        body = {**rerank_body(texts, "reranker" if named else None), "priority": "bulk"}
        out += [Client("pairs", rerank_url, "/rerank", body, 20) for _ in range(2)]
        return out

    one = Server(two_models(model, reranker))
    try:
        together = asyncio.run(run_load(clients(one.url, one.url, True), seconds))
        rss_one = one.rss_mib()
    finally:
        one.stop()
    emb, rr = Server(["--model-id", model]), Server(["--model-id", str(reranker)])
    try:
        apart = asyncio.run(run_load(clients(emb.url, rr.url, False), seconds))
        rss_two = emb.rss_mib() + rr.rss_mib()
    finally:
        emb.stop()
        rr.stop()

    def total(load: Load) -> float:
        return load.rate("bulk") + load.rate("pairs")

    return [
        "### One process with both models against one process each, same load",
        "",
        row("setup", "passages/s", "pairs/s", "total/s", "resident MiB"),
        row(*["---"] * 5),
        row("one process, two models", f"{together.rate('bulk'):.1f}",
            f"{together.rate('pairs'):.1f}", f"{total(together):.1f}", f"{rss_one:,.0f}"),
        row("two processes", f"{apart.rate('bulk'):.1f}", f"{apart.rate('pairs'):.1f}",
            f"{total(apart):.1f}", f"{rss_two:,.0f}"),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="per measured phase")
    parser.add_argument("--parts", default="single,two,split")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="the single part's servers: preempt,units,fifo,one-runner",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lanes.md")
    parser.add_argument(
        "--baseline", type=Path, help="another tree's src/ to run the single-model part on too"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT / "src"))
    sys.path.insert(0, str(ROOT))  # `bench.tokens`, run as a script from anywhere
    from bench.tokens import packaged_model

    model = str(packaged_model())
    parts = args.parts.split(",")
    lines = [f"## bench/lanes.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
             f"{args.seconds:.0f} s per phase, {os.cpu_count()} cores", ""]  # fmt: skip
    if "single" in parts:
        lines += [*part_single(model, args.seconds, args.baseline, args.variants.split(",")), ""]
    if "two" in parts or "split" in parts:
        with tempfile.TemporaryDirectory() as tmp:
            reranker = make_cross_encoder(model, Path(tmp) / "cross-encoder")
            if "two" in parts:
                lines += [*part_two(model, reranker, args.seconds), ""]
            if "split" in parts:
                lines += [*part_split(model, reranker, args.seconds), ""]
    text = "\n".join(lines)
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
