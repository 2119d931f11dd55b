"""The short query alone: where its time goes, measured A against B.

    .venv/bin/python bench/short_query.py servers A=. B=/path/to/other/tree
    .venv/bin/python bench/short_query.py servers A=. B=.:GOMP_SPINCOUNT=10000 --rounds 6
    .venv/bin/python bench/short_query.py kernels
    .venv/bin/python bench/short_query.py floors --out bench/results/floors.md
    .venv/bin/python bench/short_query.py metrics A=. B=/path/to/other/tree

`servers` starts one server per `NAME=TREE[:VAR=VALUE,...]` (TREE is a source tree whose `src/`
goes first on PYTHONPATH; the variables go into that server's environment, `ARGS=...` onto its
command line, words separated by '+'), then sends bench/run.py's short query (or `--text`: the
kernels' speed moves with the token count) to each in turn, one request at a time on one
kept-alive connection (bench/client.py's blocking client, as bench/run.py times it), `--requests`
per server per round, rounds alternating between the servers so that each sees the same machine.
Per round and over all rounds: HTTP p50 and mean, the server's own mean inference time
(`te_request_inference_duration`, from /metrics around the round), and the overhead, HTTP minus
that inference time (mean and p50).

`kernels` times, in-process, the 24 GEMMs of all-MiniLM-L6-v2's pass of the query (one row per
token, 16) on each linear kernel torch offers (oneDNN on weights reordered once, F.linear on
MKL's sgemm, MKL's packed sgemm, addmm on a transposed weight), with six layers' distinct weights
(cold: 42 MB, more than the L3 cache, as in the model) and one layer's six times (hot), rounds
interleaved, and the torch backend's bare forward of the short query beside them: how much of
that forward the GEMMs take, and so what any change outside them can win.

`floors` sets the short query (OpenVINO fp32 by default, the fastest fp32 path measured)
against what bounds it from below, in one run: the model's linear weights, larger than the L3
cache and so read from memory whole on every one-row pass, at the memory read bandwidth measured
in the same process; the same GEMMs as `kernels` times them on oneDNN, with their weights in the
caches (the kernels' compute on so few rows: the other bound) and read from memory; the
backend's bare pass in-process; and an HTTP server with no work in it (uvicorn on the server's
own protocol, answering the server's own answer bytes) under the same client, alternated with
the real server round by round. What the real server takes beyond the bare pass is its
overhead; what the bare pass takes beyond the larger bound is the rest of the pass's work.

`metrics` times, in-process, the metric records a one-text /embed makes, with each tree's
`core/metrics.py`, requests alternated between the trees, each after a read as large as the
model's linear weights (the caches as cold as the event loop finds them after a pass), and
checks that the trees' pages come out the same.

Run them holding the benchmark lock (`flock /work/wt/bench.lock ...` on the shared machines);
compare the figures within one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.client import (  # noqa: E402
    BlockingConnection,
    free_port,
    inference_seconds,
    mean_inference,
    wait_healthy,
)
from bench.corpus import SHORT_QUERY  # noqa: E402
from bench.run import (  # noqa: E402
    bare_forward_ms,
    flops_per_token,
    measure_gemm,
    query_tokens,
)
from bench.tokens import packaged_model  # noqa: E402

_QUERY = json.dumps({"inputs": [SHORT_QUERY]}).encode()


class _Server:
    def __init__(self, spec: str, model: Path, cmd: list[str] | None = None) -> None:
        """`cmd`: run this instead of `vectorpress serve` (it gets `--port`)."""
        self.name, _, rest = spec.partition("=")
        tree, _, variables = rest.partition(":")
        env = dict(v.split("=", 1) for v in variables.split(",") if v)
        args = env.pop("ARGS", "").split("+") if "ARGS" in env else []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        src = Path(tree or ".").resolve() / "src"
        self.log = Path(f"/tmp/short-query-{self.name}.log")
        if cmd is None:
            cmd = [
                sys.executable, "-m", "vectorpress", "serve", "--model-id", str(model),
                "--hostname", "127.0.0.1", *[a for a in args if a],
            ]  # fmt: skip
        cmd = [*cmd, "--port", str(self.port)]
        self.started = time.perf_counter()
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                cmd,
                env={**os.environ, "PYTHONPATH": str(src), **env},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.latencies: list[float] = []
        self.inference: list[float] = []

    def wait(self, timeout: float = 600) -> float:
        wait_healthy(self.name, self.url, self.proc, str(self.log), timeout, poll=0.1)
        return time.perf_counter() - self.started

    def round(self, requests: int, raw: bytes = _QUERY) -> tuple[list[float], float]:
        connection = BlockingConnection(self.url)
        try:
            for _ in range(10):
                connection.post_raw("/embed", raw)
            before = inference_seconds(self.url)
            lat = []
            for _ in range(requests):
                t = time.perf_counter()
                status, _ = connection.post_raw("/embed", raw)
                lat.append(time.perf_counter() - t)
                if status != 200:
                    raise RuntimeError(f"{self.name}: HTTP {status}")
            inference = mean_inference(self.url, before)
        finally:
            connection.close()
        self.latencies += lat
        self.inference.append(inference)
        return lat, inference

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _line(name: str, lat: list[float], inference: float) -> str:
    p50, mean = statistics.median(lat), statistics.mean(lat)
    return (
        f"{name}: p50 {p50 * 1e3:.2f} ms, mean {mean * 1e3:.2f}, inference "
        f"{inference * 1e3:.2f}, overhead {(mean - inference) * 1e3:.2f} (mean) / "
        f"{(p50 - inference) * 1e3:.2f} (p50)"
    )


def servers(specs: list[str], rounds: int, requests: int, text: str = SHORT_QUERY) -> None:
    model = packaged_model()
    raw = json.dumps({"inputs": [text]}).encode()
    started: list[_Server] = []
    try:
        # One after another: a torch server times its kernels at start-up (`plan_passes`), and
        # two starting together timed them against each other (one planned its short passes
        # off the ONNX graph and answered the query in 14-20 ms p50 instead of 6.5-7.8).
        for spec in specs:
            started.append(_Server(spec, model))
            print(f"{started[-1].name}: ready after {started[-1].wait():.1f} s", flush=True)
        for r in range(rounds):
            for server in started:
                lat, inference = server.round(requests, raw)
                print(_line(f"round {r} {server.name}", lat, inference), flush=True)
        print("all rounds:")
        for server in started:
            print(_line(server.name, server.latencies, statistics.mean(server.inference)))
    finally:
        for server in started:
            server.stop()


def gemm_passes(
    config: dict[str, Any], rows: int, only: tuple[str, ...] = ()
) -> dict[str, Callable[[], None]]:
    """A pass's linear layers (the shapes and layer count of `config`, random weights) on `rows`
    rows, for each linear kernel torch offers (or those named in `only`): oneDNN on weights
    reordered once, F.linear on MKL's sgemm, addmm on a transposed weight, MKL's packed sgemm
    where torch has it; each `cold` (every layer's own weights: larger than the L3 cache, read
    from memory as in the model) and `hot` (the first layer's, every time: they stay in the
    caches)."""
    import torch
    import torch.nn.functional as F

    h, inner, layers = (
        config["hidden_size"],
        config["intermediate_size"],
        config["num_hidden_layers"],
    )
    shapes = [(3 * h, h), (h, h), (inner, h), (h, inner)]  # QKV fused, output, FFN in and out
    gen = torch.Generator().manual_seed(0)
    weights = [[torch.randn(o, i, generator=gen) * 0.02 for o, i in shapes] for _ in range(layers)]
    biases = [torch.zeros(o) for o, _ in shapes]
    xs = {i: torch.randn(rows, i, generator=gen) for _, i in shapes}

    def runner(prepare: Callable[[torch.Tensor], object], call: Callable[..., object]) -> Any:
        cold = [[prepare(w) for w in layer] for layer in weights]
        hot = [cold[0]] * layers

        def make(passes: list[list[object]]) -> Callable[[], None]:
            @torch.inference_mode()
            def run() -> None:
                for layer in passes:
                    for (_, i), w, b in zip(shapes, layer, biases, strict=True):
                        call(xs[i], w, b)

            return run

        return make(cold), make(hot)

    reorder = torch.ops.mkldnn._reorder_linear_weight

    def _onednn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")

    variants: dict[str, tuple[Callable[[torch.Tensor], object], Callable[..., object]]] = {
        "oneDNN": (lambda w: reorder(w, None), _onednn),
        "F.linear": (lambda w: w, lambda x, w, b: F.linear(x, w, b)),
        "addmm": (lambda w: w.t().contiguous(), lambda x, w, b: torch.addmm(b, x, w)),
    }  # fmt: skip
    if hasattr(torch.ops.mkl, "_mkl_linear"):
        variants["MKL packed"] = (
            lambda w: (torch.ops.mkl._mkl_reorder_linear_weight(w, rows), w),
            lambda x, w, b: torch.ops.mkl._mkl_linear(x, w[0], w[1], b, rows),
        )
    fns: dict[str, Callable[[], None]] = {}
    with torch.inference_mode():
        for name, (prepare, call) in variants.items():
            if only and name not in only:
                continue
            fns[f"{name} cold"], fns[f"{name} hot"] = runner(prepare, call)
    return fns


def interleaved_ms(fns: dict[str, Callable[[], None]], rounds: int) -> dict[str, float]:
    """Each function's median time in ms over `rounds` rounds, the functions taking turns
    within each round (after two warm-up calls each)."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
        fn()
    for _ in range(rounds):
        for key, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    return {key: statistics.median(values) * 1e3 for key, values in times.items()}


def kernels(rounds: int) -> None:
    import torch

    from vectorpress.backends.torch.backend import TorchBackend
    from vectorpress.model_spec import load_model_spec
    from vectorpress.settings import ModelSettings
    from vectorpress.types import Batch, Encoding

    model = packaged_model()
    enc = query_tokens(model)
    rows = len(enc.ids)
    fns = gemm_passes(json.loads((model / "config.json").read_text()), rows)
    # The GEMMs first, before any server backend exists, and the bare forward on its own: where
    # the plan puts short passes on ONNX Runtime, its threads spin on after each run and take
    # the cores from torch ops timed right after (in-process, oneDNN's short pass taking turns
    # call by call with the graph's: 33.5 ms p50, against 4.8 in blocks of its own).
    times = interleaved_ms(fns, rounds)
    spec = load_model_spec(model, ModelSettings(str(model)))
    backend = TorchBackend(spec, "cpu", "float32")
    batch = Batch.from_encodings([Encoding(ids=enc.ids, type_ids=enc.type_ids)])
    bare = "bare forward (backend.embed)"
    times |= interleaved_ms({bare: lambda: backend.embed(batch)}, rounds)  # type: ignore[dict-item,return-value]
    print(f"{rows}-token query, {rows}-row GEMMs, {torch.get_num_threads()} threads")
    for key, ms in times.items():
        print(f"  {key}: {ms:.2f} ms (median of {rounds})")


def linear_weight_bytes(config: dict[str, Any]) -> int:
    """Bytes of an encoder's fp32 linear weights and biases: what a one-row pass reads from
    memory whole, once per pass (the embeddings are read a row per token)."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    per_layer = 4 * (h * h + h) + (h * i + i) + (i * h + h)
    return 4 * layers * per_layer


def read_bandwidth_gbps(mib: int = 256, reps: int = 9) -> float:
    """Memory read bandwidth on torch's threads: the median rate of summing a buffer far larger
    than the last-level cache (so each pass streams it from DRAM, as the short query does with
    weights larger than the cache)."""
    import torch

    buffer = torch.ones(mib * 2**20 // 4)
    rates = []
    for _ in range(reps):
        t = time.perf_counter()
        buffer.sum()
        rates.append(buffer.numel() * 4 / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


def echo(port: int, body_file: Path, read_mib: int = 0) -> None:
    """An HTTP server with no work in it: uvicorn on the server's own protocol, answering every
    POST with `body_file`'s bytes as JSON, sent as the server sends its answers. With
    `read_mib`, each POST first reads a buffer that large (a pass's weights streamed through
    the caches, leaving the rest of the path to run cold as after a forward) and reports the
    time in /metrics as the server reports its inference time."""
    import numpy as np
    import uvicorn

    from vectorpress.api.protocol import GatheringHttpTools

    body = body_file.read_bytes()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    weights = np.ones(read_mib * 2**20 // 4, dtype=np.float32)
    spent = [0.0, 0]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        answer = body
        if scope["method"] == "POST":
            t = time.perf_counter()
            weights.sum()
            spent[0] += time.perf_counter() - t
            spent[1] += 1
        elif scope["path"] == "/metrics":
            answer = (
                f"te_request_inference_duration_sum {spent[0]}\n"
                f"te_request_inference_duration_count {spent[1]}\n"
            ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [headers[0], (b"content-length", b"%d" % len(answer))],
            }
        )
        await send({"type": "http.response.body", "body": answer})

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        http=GatheringHttpTools,
        log_config=None,
        access_log=False,
        lifespan="off",
    )


def tiny_checkpoint(dest: Path) -> Path:
    """A 2-layer BERT of hidden size 32 with MiniLM's tokenizer: the server's pipeline around a
    pass that takes next to nothing and leaves the caches warm."""
    if not (dest / "config.json").is_file():
        from tests.helpers.checkpoints import make_bert_family

        make_bert_family(dest)
    return dest


def floors(backend: str, rounds: int, requests: int, out: Path | None) -> None:
    """The short query against what bounds it from below, all in one run: the model's linear
    weights streamed at the memory bandwidth measured here, the backend's bare pass, the same
    server on a tiny model, and an HTTP server with no work in it (warm, and cold after a read
    as large as the weights) answering the same bytes to the same client."""
    model = packaged_model()
    config = json.loads((model / "config.json").read_text())
    weights = linear_weight_bytes(config)
    read_mib = weights // 2**20 + 1
    bandwidth = read_bandwidth_gbps()
    tokens = len(query_tokens(model).ids)
    passes = gemm_passes(config, tokens, only=("oneDNN",))
    gemms = interleaved_ms({k: passes[f"oneDNN {k}"] for k in ("hot", "cold")}, 50)
    del passes
    h, inner = config["hidden_size"], config["intermediate_size"]
    ceiling = measure_gemm("float32", h, inner, 1.5) or float("nan")
    # GFLOP/s of the linears alone (no attention: flops_per_token over no keys).
    rate = flops_per_token(config, 0) * tokens / gemms["hot"] / 1e6
    bare = bare_forward_ms(model, backend=backend, n=200, gap=0.002, warm=20)
    tiny = tiny_checkpoint(Path(tempfile.gettempdir()) / "vectorpress-bench-tiny-bert")
    body = Path(tempfile.gettempdir()) / f"short-query-answer-{os.getpid()}.json"
    serve = [sys.executable, "-m", "vectorpress", "serve", "--hostname", "127.0.0.1"]
    echo = [sys.executable, str(Path(__file__).resolve()), "echo", "--body", str(body)]
    started: dict[str, _Server] = {}
    try:
        real = started["real"] = _Server(f"vectorpress-{backend}=.:ARGS=--backend+{backend}", model)
        real.wait()
        connection = BlockingConnection(real.url)
        body.write_bytes(connection.post_raw("/embed", _QUERY)[1])
        connection.close()
        started["tiny"] = _Server(
            "tiny=.", model, [*serve, "--model-id", str(tiny), "--backend", backend]
        )
        started["echo"] = _Server("echo=.", model, echo)
        started["cold"] = _Server("echo-cold=.", model, [*echo, "--read-mib", str(read_mib)])
        for server in started.values():
            server.wait()
        for _ in range(rounds):
            for server in started.values():
                server.round(requests)
    finally:
        for server in started.values():
            server.stop()
        body.unlink(missing_ok=True)

    def p50(name: str) -> float:
        return statistics.median(started[name].latencies) * 1e3

    def inference(name: str) -> float:
        return statistics.mean(started[name].inference) * 1e3

    stream = weights / (bandwidth * 1e9) * 1e3
    rows = [
        ("one short query over HTTP, p50", p50("real")),
        (
            "the server's mean inference time on it (te_request_inference_duration)",
            inference("real"),
        ),
        ("overhead: HTTP p50 minus inference", p50("real") - inference("real")),
        (f"the {backend} backend's bare embed of it in-process, p50", bare),
        (
            f"its linear weights ({weights / 2**20:.1f} MiB fp32) read once at "
            f"{bandwidth:.1f} GB/s (this run's DRAM read bandwidth)",
            stream,
        ),
        (
            f"its linear layers' GEMMs alone on the query's {tokens} rows, weights in the caches "
            f"(oneDNN, the fastest torch kernel here): the kernels' compute, {rate:.0f} GFLOP/s, "
            f"{rate / ceiling:.0%} of this run's 2,048-row GEMM ceiling ({ceiling:.0f})",
            gemms["hot"],
        ),
        (
            "the same GEMMs with every layer's own weights, read from memory as in the pass",
            gemms["cold"],
        ),
        (
            "the same server on a 2-layer, 32-wide BERT: overhead (HTTP p50 minus inference "
            f"{inference('tiny'):.2f} ms)",
            p50("tiny") - inference("tiny"),
        ),
        ("an HTTP server with no work answering the same bytes, p50 (same client)", p50("echo")),
        (
            f"the same reading {read_mib} MiB before each answer: p50 minus that read "
            f"({inference('cold'):.2f} ms on one thread), its path with cold caches",
            p50("cold") - inference("cold"),
        ),
        (
            "floor: the larger of the weights' read and the GEMMs' compute, plus the server "
            "with no work",
            max(stream, gemms["hot"]) + p50("echo"),
        ),
    ]
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines = [
        f"# The short query against its floors ({stamp})",
        "",
        f"`python bench/short_query.py floors --backend {backend}`: {rounds} rounds of "
        f"{requests} queries per server, the servers alternated round by round, one query at a "
        f"time on one kept-alive connection; {len(os.sched_getaffinity(0))} CPUs.",
        "",
        "| what | ms |",
        "|---|---|",
        *[f"| {what} | {ms:.2f} |" for what, ms in rows],
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if out is not None:
        out.write_text(text)


def _one_text_records(module: Any, metrics: Any) -> float:
    """The metric records a one-text /embed makes (core/infer.py: its count, its input's length
    before the pass; after the answer the run's, the request's and the batch's), the seconds of
    those after the pass returned."""
    stages = module.stage_histograms
    metrics.inc("te_request_count", method="single")
    metrics.inc("te_embed_count", 1)
    metrics.observe_many(("te_request_input_length", n) for n in (16,))
    started = time.perf_counter()
    metrics.inc("te_embed_success", 1)
    metrics.observe_many(zip(stages("te_embed"), (3e-3, 1e-4, 5e-5, 2e-3), strict=True))
    metrics.inc("te_request_success", method="single")
    metrics.observe_many(zip(stages("te_request"), (3e-3, 1e-4, 5e-5, 2e-3), strict=True))
    metrics.observe_many(
        (
            ("te_batch_next_size", 1),
            ("te_batch_next_tokens", 16),
            ("vectorpress_batch_padding_efficiency", 1.0),
        )
    )
    metrics.inc_many(
        (
            ("vectorpress_batch_real_tokens", 16),
            ("vectorpress_batch_computed_tokens", 16),
            ("vectorpress_tokens", 16),
            ("vectorpress_backend_busy_seconds", 2e-3),
        )
    )
    if hasattr(metrics, "fold_due"):
        metrics.fold_due()
    return time.perf_counter() - started


def metrics_cost(specs: list[str], requests: int) -> None:
    """Each tree's metrics module (`NAME=TREE`) recording a one-text /embed's records, the
    trees alternated request by request, each request after a read as large as the model's
    linear weights (as the event loop records them: with the caches cold from the pass)."""
    import importlib.util

    import numpy as np

    config = json.loads((packaged_model() / "config.json").read_text())
    evict = np.ones(linear_weight_bytes(config) // 8 + 2**20)
    modules, views = {}, {}
    for spec in specs:
        name, _, tree = spec.partition("=")
        path = Path(tree or ".").resolve() / "src" / "vectorpress" / "core" / "metrics.py"
        found = importlib.util.spec_from_file_location(f"metrics_{name}", path)
        assert found is not None and found.loader is not None
        module = importlib.util.module_from_spec(found)
        sys.modules[found.name] = module  # its dataclasses look their module up there
        found.loader.exec_module(module)
        modules[name], views[name] = module, module.Metrics(model="bench")
    whole: dict[str, list[float]] = {name: [] for name in modules}
    after: dict[str, list[float]] = {name: [] for name in modules}
    for i in range(requests + 50):
        for name in list(modules)[:: 1 if i % 2 else -1]:
            evict.sum()
            started = time.perf_counter()
            post = _one_text_records(modules[name], views[name])
            if i >= 50:
                whole[name].append(time.perf_counter() - started)
                after[name].append(post)
    print(f"{requests} one-text requests' metric records per tree, caches cold before each:")
    for name in modules:
        w, a = whole[name], after[name]
        print(
            f"  {name}: all {statistics.median(w) * 1e6:.1f} us p50, "
            f"{statistics.mean(w) * 1e6:.1f} mean; after the pass "
            f"{statistics.median(a) * 1e6:.1f} p50, {statistics.mean(a) * 1e6:.1f} mean"
        )
    pages = {views[name].render() for name in modules}
    print("  the trees' pages are the same" if len(pages) == 1 else "  the trees' pages DIFFER")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    srv = sub.add_parser("servers", help="A/B the short query over HTTP")
    srv.add_argument("specs", nargs="+", help="NAME=TREE[:VAR=VALUE,...]")
    srv.add_argument("--rounds", type=int, default=4)
    srv.add_argument("--requests", type=int, default=100)
    srv.add_argument(
        "--text", default=SHORT_QUERY, help="the query (default bench/run.py's, 16 tokens)"
    )
    ker = sub.add_parser("kernels", help="the short query's GEMMs on each torch kernel")
    ker.add_argument("--rounds", type=int, default=40)
    flo = sub.add_parser("floors", help="the short query against what bounds it from below")
    flo.add_argument("--backend", default="openvino", choices=["openvino", "torch"])
    flo.add_argument("--rounds", type=int, default=4)
    flo.add_argument("--requests", type=int, default=100)
    flo.add_argument("--out", type=Path, help="also write the table here (markdown)")
    met = sub.add_parser("metrics", help="a request's metric records, cold, A against B")
    met.add_argument("specs", nargs="+", help="NAME=TREE")
    met.add_argument("--requests", type=int, default=3000)
    ech = sub.add_parser("echo", help="(for floors) an HTTP server with no work")
    ech.add_argument("--body", type=Path, required=True)
    ech.add_argument("--port", type=int, required=True)
    ech.add_argument("--read-mib", type=int, default=0)
    args = ap.parse_args()
    if args.what == "servers":
        servers(args.specs, args.rounds, args.requests, args.text)
    elif args.what == "kernels":
        kernels(args.rounds)
    elif args.what == "floors":
        floors(args.backend, args.rounds, args.requests, args.out)
    elif args.what == "metrics":
        metrics_cost(args.specs, args.requests)
    else:
        echo(args.port, args.body, args.read_mib)


if __name__ == "__main__":
    main()
