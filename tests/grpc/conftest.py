"""Live servers with gRPC on real loopback ports, with stubs made from the packaged tei.proto."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.grpc.clients import Stubs, splade_path
from tests.helpers.faulty import FaultyBackend, faulty_factory
from tests.helpers.server import LiveServer
from vectorpress.settings import Settings


def _serve(settings: Settings, **kwargs: Any) -> Iterator[tuple[LiveServer, Stubs]]:
    with LiveServer(settings, grpc=True, **kwargs) as srv:
        stubs = Stubs.connect(srv.grpc_target)
        try:
            yield srv, stubs
        finally:
            stubs.channel.close()


@pytest.fixture(scope="session")
def minilm_grpc(minilm: Path) -> Iterator[tuple[LiveServer, Stubs]]:
    """The real all-MiniLM-L6-v2, with the permits of the 1,000-message stream test."""
    yield from _serve(
        Settings.single(str(minilm), max_concurrent_requests=16, max_batch_tokens=4096)
    )


@pytest.fixture(scope="session")
def reranker_grpc(tiny_bert_family: Callable[..., Path]) -> Iterator[tuple[LiveServer, Stubs]]:
    yield from _serve(Settings.single(str(tiny_bert_family(task="reranker"))))


@pytest.fixture(scope="session")
def classifier_grpc(tiny_bert_family: Callable[..., Path]) -> Iterator[tuple[LiveServer, Stubs]]:
    yield from _serve(Settings.single(str(tiny_bert_family(task="classifier"))))


@pytest.fixture(scope="session")
def splade_grpc() -> Iterator[tuple[LiveServer, Stubs]]:
    yield from _serve(Settings.single(str(splade_path()), pooling="splade"))


@pytest.fixture
def gated_grpc(
    tiny_bert_family: Callable[..., Path],
) -> Iterator[tuple[LiveServer, Stubs, FaultyBackend]]:
    """A tiny embedder with 4 permits whose forward passes wait for `backend.gate` (open)."""
    make, made = faulty_factory()
    settings = Settings.single(str(tiny_bert_family()), max_concurrent_requests=4)
    for srv, stubs in _serve(settings, make_backend=make):
        backend = made[0]
        backend.gate = gate = threading.Event()
        gate.set()
        try:
            yield srv, stubs, backend
        finally:
            gate.set()
