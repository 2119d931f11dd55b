"""Tokenization and responses do not wait for the forward pass: while one batch runs on the
model thread, the next request is tokenized and queued, and other routes are answered."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np

from tests.helpers.faulty import faulty_factory
from tests.helpers.server import LiveServer
from vectorpress.settings import Settings


def _queue_size(url: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("te_queue_size"):
            return float(line.split()[-1])
    raise AssertionError("te_queue_size is not on /metrics")


def test_the_next_request_is_tokenized_and_queued_during_a_forward_pass(minilm: Path) -> None:
    make, made = faulty_factory()
    settings = Settings.single(str(minilm), max_batch_requests=1)
    with LiveServer(settings, make_backend=make) as srv, ThreadPoolExecutor(2) as pool:
        backend = made[0]
        url = f"{srv.url}/embed"
        want = np.array(httpx.post(url, json={"inputs": "the second one"}, timeout=30).json())
        backend.gate = threading.Event()
        backend.started.clear()
        try:
            first = pool.submit(httpx.post, url, json={"inputs": "the first one"}, timeout=60)
            assert backend.started.wait(30), "the first forward pass never started"
            second = pool.submit(httpx.post, url, json={"inputs": "the second one"}, timeout=60)
            # The model thread is held inside the first pass; the second request still gets
            # through tokenization into the queue, and other routes answer meanwhile.
            for _ in range(300):
                if _queue_size(srv.url) == 1:
                    break
                threading.Event().wait(0.05)
            assert _queue_size(srv.url) == 1
            assert not first.done() and not second.done()
            tokens = httpx.post(f"{srv.url}/tokenize", json={"inputs": "meanwhile"}, timeout=10)
            assert tokens.status_code == 200
        finally:
            backend.gate.set()
        assert first.result().status_code == 200
        got = second.result()
        assert got.status_code == 200
        np.testing.assert_allclose(np.array(got.json()), want, rtol=0, atol=1e-6)
