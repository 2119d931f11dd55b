"""Faults inside the backend: a failing batch, a dead worker, out of memory, gone clients."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.faulty import FaultyBackend, faulty_factory, leave_while_queued
from tests.helpers.server import LiveServer
from vectorpress.settings import Settings

POISON_ID = 9947  # "poison" in the MiniLM vocabulary


@pytest.fixture
def faulty(minilm: Path) -> Iterator[tuple[LiveServer, FaultyBackend]]:
    make, made = faulty_factory()
    settings = Settings.single(str(minilm), max_batch_requests=1, max_concurrent_requests=64)
    with LiveServer(settings, make_backend=make) as srv:
        backend = made[0]
        backend.batches.clear()
        yield srv, backend


def post(srv: LiveServer, text: str, client: httpx.Client | None = None) -> httpx.Response:
    return (client or httpx).post(f"{srv.url}/embed", json={"inputs": text}, timeout=60)


def test_exception_fails_only_its_batch(faulty: tuple[LiveServer, FaultyBackend]) -> None:
    srv, backend = faulty
    assert srv.infer.tokenizers._new_tokenizer().token_to_id("poison") == POISON_ID
    backend.fail_if = lambda batch: POISON_ID in batch.input_ids.tolist()

    async def mixed() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            texts = ["fine one", "poison here", "fine two", "fine three"]
            return list(
                await asyncio.gather(
                    *(client.post(f"{srv.url}/embed", json={"inputs": t}) for t in texts)
                )
            )

    responses = asyncio.run(mixed())
    assert [r.status_code for r in responses] == [200, 424, 200, 200]
    assert responses[1].json()["error_type"] == "Backend"
    assert "injected fault" in responses[1].json()["error"]
    assert post(srv, "next batch runs").status_code == 200
    assert httpx.get(f"{srv.url}/health").status_code == 200


def test_dead_worker_makes_health_503_and_requests_fail_fast(
    faulty: tuple[LiveServer, FaultyBackend],
) -> None:
    srv, backend = faulty
    backend.kill_next = True
    first = post(srv, "the batch that kills the worker")
    assert first.status_code == 503 and first.json()["error_type"] == "Unhealthy"
    health = httpx.get(f"{srv.url}/health")
    assert health.status_code == 503
    assert health.json() == {"error": "unhealthy", "error_type": "Unhealthy"}
    later = post(srv, "anyone after")
    assert later.status_code == 503 and later.json()["error_type"] == "Unhealthy"


def test_out_of_memory_splits_the_batch_before_failing(minilm: Path) -> None:
    make, made = faulty_factory()
    settings = Settings.single(str(minilm), max_concurrent_requests=64)
    with LiveServer(settings, make_backend=make) as srv:
        backend = made[0]
        backend.batches.clear()
        backend.oom_above = 1
        backend.delay = 0.05

        async def burst() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as client:
                responses = await asyncio.gather(
                    *(
                        client.post(f"{srv.url}/embed", json={"inputs": f"text number {i}"})
                        for i in range(12)
                    )
                )
            return [r.status_code for r in responses]

        assert asyncio.run(burst()) == [200] * 12
        sizes = [len(b) for b in backend.batches]
        assert max(sizes) > 1, "the burst never formed a multi-input batch"
        assert 1 in sizes, "an oversized batch was not split"


def test_input_of_a_gone_client_is_dropped_before_the_forward_pass(
    faulty: tuple[LiveServer, FaultyBackend],
) -> None:
    srv, backend = faulty
    backend.delay = 1.0
    dropped_before = srv.infer.metrics.value("te_request_failure", err="dropped")

    assert leave_while_queued(srv.url, "poison never computed") == 200
    backend.delay = 0.0
    assert post(srv, "after").status_code == 200
    seen = [ids for batch in backend.batches for ids in batch]
    assert not any(POISON_ID in ids for ids in seen), "a gone client's input was computed"
    assert srv.infer.metrics.value("te_request_failure", err="dropped") > dropped_before


def test_a_client_gone_before_its_body_arrived_costs_nothing(
    faulty: tuple[LiveServer, FaultyBackend], caplog: pytest.LogCaptureFixture
) -> None:
    """Half a body, then the connection closes: no input reaches a batch, nothing is logged
    as an error, and the server answers the next caller."""
    srv, backend = faulty
    backend.batches.clear()
    caplog.set_level(logging.WARNING)
    for path in ("/embed", "/v1/embeddings", "/tokenize", "/predict"):
        with socket.create_connection(("127.0.0.1", srv.port)) as sock:
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: vp\r\nContent-Type: application/json\r\n"
                f'Content-Length: 1000\r\n\r\n{{"inputs": "poison'.encode()
            )
            time.sleep(0.2)
    time.sleep(0.3)
    assert post(srv, "after").status_code == 200
    seen = [ids for batch in backend.batches for ids in batch]
    assert not any(POISON_ID in ids for ids in seen)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]
