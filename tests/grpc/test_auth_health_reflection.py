"""API key on the TEI services, grpc.health.v1 per model kind, and server reflection."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from tests.grpc.clients import Stubs
from tests.helpers.server import LiveServer
from vectorpress.api.grpc.stubs import pb
from vectorpress.settings import Settings

Server = tuple[LiveServer, Stubs]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
KEY = "s3cret-key"


def health_of(stubs: Stubs) -> dict[str, int]:
    health = health_pb2_grpc.HealthStub(stubs.channel)
    names = ["", "tei.v1.Info", "tei.v1.Tokenize", "tei.v1.Embed", "tei.v1.Predict"]
    names.append("tei.v1.Rerank")
    return {n: health.Check(health_pb2.HealthCheckRequest(service=n)).status for n in names}


def test_api_key(tiny_bert_family: Callable[..., Path]) -> None:
    settings = Settings.single(str(tiny_bert_family()), api_key=KEY)
    with LiveServer(settings, grpc=True) as srv:
        stubs = Stubs.connect(srv.grpc_target)
        calls: list[Callable[[list[tuple[str, str]] | None], Any]] = [
            lambda md: stubs.info.Info(pb.InfoRequest(), metadata=md),
            lambda md: stubs.embed.Embed(pb.EmbedRequest(inputs="x"), metadata=md),
            lambda md: list(
                stubs.embed.EmbedStream(iter([pb.EmbedRequest(inputs="x")]), metadata=md)
            ),
            lambda md: stubs.predict.Predict(pb.PredictRequest(inputs="x"), metadata=md),
            lambda md: stubs.rerank.RerankStream(
                iter([pb.RerankStreamRequest(query="q", text="t")]), metadata=md
            ),
            lambda md: stubs.tokenize.Tokenize(pb.EncodeRequest(inputs="x"), metadata=md),
            lambda md: list(
                stubs.tokenize.DecodeStream(iter([pb.DecodeRequest(ids=[5])]), metadata=md)
            ),
        ]
        for call in calls:
            for md in (None, [("authorization", "Bearer wrong")], [("authorization", KEY)]):
                with pytest.raises(grpc.RpcError) as err:
                    call(md)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert err.value.details() == "No valid auth token"
        good = [("authorization", f"Bearer {KEY}")]
        assert stubs.info.Info(pb.InfoRequest(), metadata=good).model_id == settings.model.model_id
        assert len(stubs.embed.Embed(pb.EmbedRequest(inputs="x"), metadata=good).embeddings)
        encode = iter([pb.EncodeRequest(inputs="x")])
        assert len(list(stubs.tokenize.TokenizeStream(encode, metadata=good))) == 1
        # Health and reflection are open without the key.
        assert health_of(stubs)["tei.v1.Embed"] == SERVING
        assert "tei.v1.Embed" in ProtoReflectionDescriptorDatabase(stubs.channel).get_services()
        stubs.channel.close()


def test_health_follows_the_model_kind(
    minilm_grpc: Server, reranker_grpc: Server, classifier_grpc: Server
) -> None:
    always = {"": SERVING, "tei.v1.Info": SERVING, "tei.v1.Tokenize": SERVING}
    assert health_of(minilm_grpc[1]) == always | {
        "tei.v1.Embed": SERVING,
        "tei.v1.Predict": NOT_SERVING,
        "tei.v1.Rerank": NOT_SERVING,
    }
    assert health_of(classifier_grpc[1]) == always | {
        "tei.v1.Embed": NOT_SERVING,
        "tei.v1.Predict": SERVING,
        "tei.v1.Rerank": NOT_SERVING,
    }
    assert health_of(reranker_grpc[1]) == always | {
        "tei.v1.Embed": NOT_SERVING,
        "tei.v1.Predict": SERVING,
        "tei.v1.Rerank": SERVING,
    }
    health = health_pb2_grpc.HealthStub(minilm_grpc[1].channel)
    with pytest.raises(grpc.RpcError) as err:
        health.Check(health_pb2.HealthCheckRequest(service="tei.v1.Nope"))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_reflection_lists_services_and_serves_usable_descriptors(minilm_grpc: Server) -> None:
    """A client with no compiled proto at all calls Embed from what reflection tells it."""
    srv, stubs = minilm_grpc
    database = ProtoReflectionDescriptorDatabase(stubs.channel)
    services = set(database.get_services())
    assert {
        "tei.v1.Info",
        "tei.v1.Embed",
        "tei.v1.Predict",
        "tei.v1.Rerank",
        "tei.v1.Tokenize",
        "grpc.health.v1.Health",
    } <= services
    assert any(s.startswith("grpc.reflection.") for s in services)
    pool = descriptor_pool.DescriptorPool(database)
    service = pool.FindServiceByName("tei.v1.Embed")
    method = service.methods_by_name["Embed"]
    assert method.input_type.fields_by_name["dimensions"].number == 6
    request_cls = message_factory.GetMessageClass(method.input_type)
    response_cls = message_factory.GetMessageClass(method.output_type)
    call = stubs.channel.unary_unary(
        "/tei.v1.Embed/Embed",
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )
    response = call(request_cls(inputs="reflected", dimensions=64))
    assert len(response.embeddings) == 64
    assert pool.FindServiceByName("grpc.health.v1.Health").methods_by_name["Check"]
    assert srv.infer.spec.kind == "embedding"
