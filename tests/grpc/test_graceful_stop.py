"""`vectorpress serve --grpc-port` as a real process: SIGTERM lets RPCs in flight finish."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.helpers.process import free_port, run_to_exit
from vectorpress.api.grpc.stubs import pb, pb_grpc

# Distinct lengths, so each answer's compute_chars names the message it answers.
POOL = [f"message {'word ' * k}end" for k in range(20)]
MESSAGES = 600
FIRST = 10


def wait_serving(target: str, proc: subprocess.Popen[str], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"server exited early: {proc.stderr.read()[-3000:]}"  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "server never became SERVING"
        with grpc.insecure_channel(target) as channel:
            try:
                status = (
                    health_pb2_grpc.HealthStub(channel)
                    .Check(health_pb2.HealthCheckRequest(service="tei.v1.Embed"), timeout=2)
                    .status
                )
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
        time.sleep(0.2)


def test_sigterm_finishes_the_stream_in_flight_then_exits_0(
    tiny_bert_family: Callable[..., Path],
) -> None:
    port = free_port()
    target = f"127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "vectorpress", "serve", "--model-id", str(tiny_bert_family())]
    cmd += ["--hostname", "127.0.0.1", "--port", "0", "--grpc-port", str(port)]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    try:
        wait_serving(target, proc)
        signalled = threading.Event()
        answered = threading.Event()

        def requests() -> Iterator[object]:
            for i in range(MESSAGES):
                if i == FIRST:
                    assert signalled.wait(60)  # the rest are sent after SIGTERM
                yield pb.EmbedRequest(inputs=POOL[i % len(POOL)])

        chars: list[int] = []
        failure: list[BaseException] = []

        def consume() -> None:
            with grpc.insecure_channel(target) as channel:
                try:
                    for response in pb_grpc.EmbedStub(channel).EmbedStream(requests()):
                        chars.append(response.metadata.compute_chars)
                        answered.set()
                except BaseException as exc:
                    failure.append(exc)
                    answered.set()

        consumer = threading.Thread(target=consume)
        consumer.start()
        assert answered.wait(60)
        proc.send_signal(signal.SIGTERM)

        # New calls are refused while the stream is still open...
        deadline = time.monotonic() + 20
        while True:
            with grpc.insecure_channel(target) as channel:
                try:
                    pb_grpc.EmbedStub(channel).Embed(pb.EmbedRequest(inputs="late"), timeout=5)
                except grpc.RpcError as exc:
                    # UNAVAILABLE once the server refuses calls; a call that reached it just
                    # before, not yet taken by a handler when the stop began, gRPC's core fails
                    # as CANCELLED (grpc/grpc#41785; seen once in a full suite): refused either
                    # way, not left waiting.
                    assert exc.code() in (
                        grpc.StatusCode.UNAVAILABLE,
                        grpc.StatusCode.CANCELLED,
                    ), exc
                    break
            assert time.monotonic() < deadline, "new calls still accepted after SIGTERM"
            time.sleep(0.05)
        assert proc.poll() is None, "the server left before its stream finished"

        # ... and the stream in flight gets every answer, in order.
        signalled.set()
        consumer.join(120)
        assert not failure, failure
        assert chars == [len(POOL[i % len(POOL)]) for i in range(MESSAGES)]
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


@pytest.mark.parametrize("port", ["-1", "70000"])
def test_bad_grpc_port_stops_start_up(port: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "vectorpress", "serve", "--model-id", "x", "--grpc-port", port],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1
    assert f"--grpc-port must be between 0 and 65535, got {port}" in done.stderr


def test_grpc_port_in_use_stops_start_up(tiny_bert_family: Callable[..., Path]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_to_exit(
            ["--model-id", str(tiny_bert_family()), "--grpc-port", str(port)],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"vectorpress: error: --grpc-port {port}: " in done.stderr
