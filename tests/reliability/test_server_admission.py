"""Admission with several models: each model's permit pool (--max-concurrent-requests) and the
server-wide cap across them (--max-total-concurrent-requests), both refusing at once with 429,
on a real server whose forward passes are held at a gate."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.helpers.faulty import FaultyBackend, faulty_factory
from tests.helpers.server import LiveServer
from vectorpress.settings import ModelSettings, ServerSettings, Settings


def _serve(
    tiny_bert_family: Callable[..., Path], per_model: int, total: int | None
) -> tuple[LiveServer, list[FaultyBackend]]:
    folder = tiny_bert_family("bert", "embedding", "mean")
    models = (
        ModelSettings(str(folder), served_model_name="e"),
        ModelSettings(str(folder), served_model_name="f"),
    )
    server = ServerSettings(max_concurrent_requests=per_model, max_total_concurrent_requests=total)
    make, made = faulty_factory()
    return LiveServer(Settings(server, models), make), made


def _permits(srv: LiveServer) -> dict[str, int]:
    """Free permits: each model's, and the server's (when capped)."""
    assert srv.served is not None
    out = {m.name: m.infer.admission.available for m in srv.served.state.models}
    shared = srv.served.state.models.default.infer.server_admission
    if shared is not None:
        out["server"] = shared.available
    return out


async def _while_held(
    srv: LiveServer, made: list[FaultyBackend], held: list[str], then: list[str]
) -> tuple[list[int], list[int]]:
    """With every forward pass held at a gate: one single-input request per name in `held`,
    admitted (its permits taken), then one per name in `then`, answered while the first are
    held. Opens the gate; the statuses of `then`'s and of `held`'s requests."""
    gate = threading.Event()
    for backend in made:
        backend.gate = gate
    before = sum(_permits(srv).values())
    try:
        async with httpx.AsyncClient(timeout=60) as http:
            first = [
                asyncio.ensure_future(
                    http.post(f"{srv.url}/embed", json={"inputs": "x", "model": m})
                )
                for m in held
            ]
            # Each admitted request takes one of its model's permits (and one of the server's).
            per_request = 2 if "server" in _permits(srv) else 1
            deadline = time.monotonic() + 30
            while sum(_permits(srv).values()) > before - per_request * len(held):
                assert time.monotonic() < deadline, _permits(srv)
                await asyncio.sleep(0.02)
            second = [
                (await http.post(f"{srv.url}/embed", json={"inputs": "y", "model": m})).status_code
                for m in then
            ]
            assert not any(t.done() for t in first), "answered while the device was held"
            gate.set()
            return second, [(await t).status_code for t in first]
    finally:
        gate.set()
        for backend in made:
            backend.gate = None


def test_the_server_wide_cap_spans_every_model(tiny_bert_family: Callable[..., Path]) -> None:
    srv, made = _serve(tiny_bert_family, per_model=8, total=3)
    with srv:
        # The server's three permits held (two by e, one by f): f's own pool has seven free,
        # and still a fourth request, to either model, is refused at once.
        refused, held = asyncio.run(_while_held(srv, made, ["e", "e", "f"], ["f", "e"]))
        assert refused == [429, 429] and held == [200, 200, 200]
        assert _permits(srv) == {"e": 8, "f": 8, "server": 3}, "every permit came back"
        for name in ("e", "f"):
            r = httpx.post(f"{srv.url}/embed", json={"inputs": "z", "model": name}, timeout=60)
            assert r.status_code == 200


def test_each_models_pool_is_its_own(tiny_bert_family: Callable[..., Path]) -> None:
    srv, made = _serve(tiny_bert_family, per_model=2, total=None)
    with srv:
        # e's two permits held and f's one: e refuses a third (f's pool is apart).
        second, held = asyncio.run(_while_held(srv, made, ["e", "e", "f"], ["e"]))
        assert second == [429] and held == [200, 200, 200]
        assert _permits(srv) == {"e": 2, "f": 2}
        assert post_ok(srv, "f") and post_ok(srv, "e")


def post_ok(srv: LiveServer, model: str) -> bool:
    r = httpx.post(f"{srv.url}/embed", json={"inputs": "z", "model": model}, timeout=60)
    return r.status_code == 200
