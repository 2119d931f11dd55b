"""/health says 200 only when the backend really answers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.helpers.faulty import faulty_factory
from tests.helpers.server import LiveServer
from vectorpress.settings import Settings


def test_health_probes_after_a_failed_batch_and_is_cheap_after_good_work(
    tiny_bert_family: Callable[..., Path],
) -> None:
    make, made = faulty_factory()
    settings = Settings.single(str(tiny_bert_family("bert", "embedding", "mean")))
    with LiveServer(settings, make_backend=make) as srv:
        backend = made[0]
        backend.batches.clear()
        health = f"{srv.url}/health"

        # After good work the check costs no forward pass.
        assert httpx.post(f"{srv.url}/embed", json={"inputs": "fine"}).status_code == 200
        assert httpx.get(health).status_code == 200
        assert len(backend.batches) == 1

        # A failing backend: the request fails, and health runs a one-token forward that
        # fails too, for every probe path.
        backend.fail_if = lambda batch: True
        assert httpx.post(f"{srv.url}/embed", json={"inputs": "broken"}).status_code == 424
        for path in ("/health", "/ping", "/"):
            response = httpx.get(f"{srv.url}{path}")
            assert response.status_code == 503, path
            assert response.json()["error_type"] == "Unhealthy"
        probes = backend.batches[2:]
        assert probes and all(len(b) == 1 and len(b[0]) == 1 for b in probes)

        # Concurrent checks against a failing backend share one probe (slowed down here so
        # that all sixteen checks arrive while it runs).
        backend.batches.clear()
        backend.delay = 1.0

        async def many() -> list[int]:
            async with httpx.AsyncClient(timeout=60) as client:
                got = await asyncio.gather(*(client.get(health) for _ in range(16)))
            return [r.status_code for r in got]

        assert asyncio.run(many()) == [503] * 16
        assert sum(len(b) for b in backend.batches) <= 2  # sequences forwarded, not 16
        backend.delay = 0.0

        # The backend recovers: the next probe passes and later checks are cheap again.
        backend.fail_if = None
        backend.batches.clear()
        assert httpx.get(health).status_code == 200
        assert len(backend.batches) == 1
        assert httpx.get(health).status_code == 200
        assert len(backend.batches) == 1
