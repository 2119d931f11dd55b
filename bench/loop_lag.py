"""Event-loop lag under large tokenizer and token-embedding answers (about a minute).

    .venv/bin/python bench/loop_lag.py [--seconds 6]

A real server process on all-MiniLM-L6-v2 (HTTP and gRPC) measures its own event loop: a task
sleeps 1 ms over and over and records how late it wakes. The parent sends, phase by phase, a
stream of large requests (8 inputs of 60,000 CJK characters to /tokenize, 4 x 60,000 ids to
/decode, 32 x 256 tokens to /embed_all, the same over gRPC Tokenize / EmbedAll) while one client
sends a one-word /embed after another. Reported per phase: the loop's worst and 99th-percentile
lag, the small request's median and worst latency, and how long one large request took.
Not a CI test: figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.client import Connection, free_port  # noqa: E402

CJK = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(60_000))
SMALL = {"inputs": "hello"}


# -- the server process --------------------------------------------------------------------------


def serve(http_port: int, grpc_port: int, samples: Path) -> None:
    """The real server, plus a task on its loop that records (time, lag) every millisecond."""
    from tests.helpers.checkpoints import minilm_path

    from vectorpress.server import load, run_event_loop
    from vectorpress.server import serve as serve_forever
    from vectorpress.settings import Settings

    settings = Settings.single(
        str(minilm_path()),
        hostname="127.0.0.1",
        port=http_port,
        grpc_port=grpc_port,
        payload_limit=8_000_000,
    )
    served = load(settings)
    lags: list[tuple[float, float]] = []

    async def monitor() -> None:
        while True:
            t = time.monotonic()
            await asyncio.sleep(0.001)
            lags.append((t, time.monotonic() - t - 0.001))

    async def main() -> None:
        task = asyncio.ensure_future(monitor())
        try:
            await serve_forever(served)
        finally:
            task.cancel()
            samples.write_text(json.dumps(lags))

    run_event_loop(main())


# -- the load ------------------------------------------------------------------------------------


def pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]


async def small_client(url: str, until: float, out: list[float]) -> None:
    conn = Connection(url)
    try:
        while time.monotonic() < until:
            t = time.perf_counter()
            status, _ = await conn.post("/embed", SMALL)
            assert status == 200, status
            out.append(time.perf_counter() - t)
            await asyncio.sleep(0.005)
    finally:
        await conn.close()


async def large_client(send: Callable[[], Awaitable[None]], until: float, out: list[float]) -> None:
    while time.monotonic() < until:
        t = time.perf_counter()
        await send()
        out.append(time.perf_counter() - t)


def http_sender(url: str, path: str, payload: object) -> Callable[[], Awaitable[None]]:
    conn = Connection(url)

    async def send() -> None:
        status, body = await conn.post(path, payload)
        assert status == 200, (status, body[:200])

    return send


def grpc_senders(target: str) -> dict[str, Callable[[], Awaitable[None]]]:
    import grpc

    from vectorpress.api.grpc.stubs import pb, pb_grpc

    channel = grpc.aio.insecure_channel(
        target, options=[("grpc.max_receive_message_length", 256 << 20)]
    )
    tokenize = pb_grpc.TokenizeStub(channel)
    embed = pb_grpc.EmbedStub(channel)
    text = " ".join(["word"] * 250)

    async def grpc_tokenize() -> None:
        await tokenize.Tokenize(pb.EncodeRequest(inputs=CJK, add_special_tokens=True))

    async def grpc_embed_all() -> None:
        await embed.EmbedAll(pb.EmbedRequest(inputs=text, truncate=True))

    return {"grpc Tokenize": grpc_tokenize, "grpc EmbedAll": grpc_embed_all}


async def drive(url: str, grpc_target: str, seconds: float) -> list[dict[str, object]]:
    from tests.helpers.checkpoints import minilm_path
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_path() / "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    ids = tok.encode(CJK, add_special_tokens=False).ids
    long_text = " ".join(["word"] * 250)
    senders: dict[str, Callable[[], Awaitable[None]] | None] = {
        "idle": None,
        "/tokenize 8 x 60k CJK": http_sender(url, "/tokenize", {"inputs": [CJK] * 8}),
        "/decode 4 x 60k ids": http_sender(url, "/decode", {"ids": [ids] * 4}),
        "/embed_all 32 x 256 tokens": http_sender(
            url, "/embed_all", {"inputs": [long_text] * 32, "truncate": True}
        ),
        **grpc_senders(grpc_target),
    }
    phases = []
    for name, send in senders.items():
        start = time.monotonic()
        until = start + seconds
        small: list[float] = []
        large: list[float] = []
        jobs = [small_client(url, until, small)]
        if send is not None:
            jobs.append(large_client(send, until, large))
        await asyncio.gather(*jobs)
        phases.append(
            {"phase": name, "start": start, "end": time.monotonic(), "small": small, "large": large}
        )
        await asyncio.sleep(0.5)
    return phases


def report(phases: list[dict[str, object]], lags: list[tuple[float, float]]) -> None:
    print(
        f"{'phase':<28} {'loop lag max':>13} {'p99':>8} {'small p50':>10} {'small max':>10} "
        f"{'small n':>8} {'large mean':>11}"
    )
    for ph in phases:
        start, end = float(ph["start"]), float(ph["end"])  # type: ignore[arg-type]
        window = [lag for t, lag in lags if start <= t <= end]
        small: list[float] = ph["small"]  # type: ignore[assignment]
        large: list[float] = ph["large"]  # type: ignore[assignment]
        mean = sum(large) / len(large) if large else float("nan")
        print(
            f"{ph['phase']:<28} {max(window, default=0) * 1e3:>10.1f} ms "
            f"{pct(window, 0.99) * 1e3:>5.1f} ms {pct(small, 0.5) * 1e3:>7.1f} ms "
            f"{max(small, default=0) * 1e3:>7.1f} ms {len(small):>8} {mean:>9.2f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="length of each phase")
    parser.add_argument("--serve", nargs=3, metavar=("HTTP", "GRPC", "SAMPLES"), help="internal")
    args = parser.parse_args()
    if args.serve:
        serve(int(args.serve[0]), int(args.serve[1]), Path(args.serve[2]))
        return
    http_port, grpc_port = free_port(), free_port()
    with tempfile.TemporaryDirectory() as tmp:
        samples = Path(tmp) / "lags.json"
        env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        cmd = [sys.executable, __file__, "--serve", str(http_port), str(grpc_port), str(samples)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{http_port}"
            deadline = time.monotonic() + 120
            while True:
                try:
                    with socket.create_connection(("127.0.0.1", http_port), timeout=1):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit("the server did not start") from None
                    time.sleep(0.2)
            phases = asyncio.run(drive(url, f"127.0.0.1:{grpc_port}", args.seconds))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
        lags = [(float(t), float(lag)) for t, lag in json.loads(samples.read_text())]
    print(f"{os.cpu_count()} CPUs; loop lag = how late a 1 ms sleep on the server's loop wakes")
    report(phases, lags)


if __name__ == "__main__":
    main()
