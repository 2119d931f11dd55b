"""Every row of the error table as a gRPC status, over a real port; the server keeps serving."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.grpc.clients import Stubs
from tests.helpers.faulty import FaultyBackend
from tests.helpers.server import LiveServer
from vectorpress.api.grpc.stubs import pb

Server = tuple[LiveServer, Stubs]
Code = grpc.StatusCode


def status_of(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    """Wait until the server reaches a state; fails only if it never does."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def test_validation_rows(minilm_grpc: Server) -> None:
    srv, stubs = minilm_grpc
    embed, tokenize = stubs.embed, stubs.tokenize
    cases: list[tuple[Callable[[], Any], str]] = [
        (lambda: embed.Embed(pb.EmbedRequest(inputs="")), "`inputs` cannot be empty"),
        (lambda: embed.EmbedAll(pb.EmbedAllRequest(inputs="")), "`inputs` cannot be empty"),
        (lambda: tokenize.Decode(pb.DecodeRequest(ids=[])), "`input_ids` cannot be empty"),
        (
            lambda: embed.Embed(pb.EmbedRequest(inputs="x " * 300)),
            "`inputs` must have less than 256 tokens. Given: 302",
        ),
        (
            lambda: embed.Embed(pb.EmbedRequest(inputs="a" * 64001)),
            "must have less than 64000 characters. Given: 64001",
        ),
        (
            lambda: tokenize.Tokenize(pb.EncodeRequest(inputs="a" * 64001)),
            "must have less than 64000 characters",
        ),
        (
            lambda: embed.Embed(pb.EmbedRequest(inputs="hi", prompt_name="nope")),
            "nope",
        ),
        (
            lambda: embed.Embed(pb.EmbedRequest(inputs="hi", dimensions=0)),
            "`dimensions` should be positive",
        ),
        (
            lambda: embed.Embed(pb.EmbedRequest(inputs="hi", dimensions=385)),
            "`dimensions` should be smaller than the maximum embedding dimension",
        ),
        (
            lambda: tokenize.Decode(pb.DecodeRequest(ids=[10**6])),
            "outside the vocabulary",
        ),
        (
            lambda: embed.Embed(pb.EmbedRequest(inputs="hi", truncation_direction=7)),
            "`truncation_direction` 7 is not RIGHT (0) or LEFT (1)",
        ),
    ]
    for call, text in cases:
        code, details = status_of(call)
        assert code == Code.INVALID_ARGUMENT, details
        assert text in details, details
    # ... and the server goes on serving.
    assert len(embed.Embed(pb.EmbedRequest(inputs="still here")).embeddings) == 384
    assert srv.infer.admission.available == srv.infer.admission.capacity


def test_rerank_and_predict_pair_validation(reranker_grpc: Server) -> None:
    _, stubs = reranker_grpc
    code, details = status_of(lambda: stubs.rerank.Rerank(pb.RerankRequest(query="q")))
    assert (code, details) == (Code.INVALID_ARGUMENT, "`texts` cannot be empty")
    code, details = status_of(lambda: stubs.rerank.RerankStream(iter([])))
    assert (code, details) == (Code.INVALID_ARGUMENT, "`texts` cannot be empty")
    code, details = status_of(
        lambda: stubs.rerank.Rerank(pb.RerankRequest(query="q", texts=["t"] * 33))
    )
    assert code == Code.INVALID_ARGUMENT
    assert details == "batch size 33 > maximum allowed batch size 32"
    for n in (0, 3):
        code, details = status_of(
            lambda n=n: stubs.predict.PredictPair(pb.PredictPairRequest(inputs=["a"] * n))
        )
        assert (code, details) == (
            Code.INVALID_ARGUMENT,
            f"`inputs` must have a single or two elements. Given: {n}",
        )
    code, details = status_of(
        lambda: stubs.predict.PredictPair(pb.PredictPairRequest(inputs=["", ""]))
    )
    assert code == Code.INVALID_ARGUMENT and "cannot be empty" in details


def test_wrong_model_type_is_failed_precondition(
    minilm_grpc: Server, reranker_grpc: Server, classifier_grpc: Server
) -> None:
    embedder, reranker, classifier = minilm_grpc[1], reranker_grpc[1], classifier_grpc[1]
    cases = [
        (lambda: reranker.embed.Embed(pb.EmbedRequest(inputs="x")), "not an embedding model"),
        (
            lambda: reranker.embed.EmbedAll(pb.EmbedAllRequest(inputs="x")),
            "not an embedding model",
        ),
        (
            lambda: embedder.embed.EmbedSparse(pb.EmbedSparseRequest(inputs="x")),
            "Model is not an embedding model with SPLADE pooling",
        ),
        (
            lambda: embedder.predict.Predict(pb.PredictRequest(inputs="x")),
            "Model is not a classifier model",
        ),
    ]
    for call, text in cases:
        code, details = status_of(call)
        assert code == Code.FAILED_PRECONDITION, details
        assert details.startswith("Backend error: ") and text in details, details
    # TEI's gRPC Rerank words its two without the prefix.
    rerank_cases = [
        (
            lambda: embedder.rerank.Rerank(pb.RerankRequest(query="q", texts=["t"])),
            "model is not a classifier model",
        ),
        (
            lambda: embedder.rerank.RerankStream(
                iter([pb.RerankStreamRequest(query="q", text="t")])
            ),
            "model is not a classifier model",
        ),
        (
            lambda: classifier.rerank.Rerank(pb.RerankRequest(query="q", texts=["t"])),
            "model is not a re-ranker model",
        ),
        (
            lambda: classifier.rerank.RerankStream(
                iter([pb.RerankStreamRequest(query="q", text="t")])
            ),
            "model is not a re-ranker model",
        ),
    ]
    for call, text in rerank_cases:
        assert status_of(call) == (Code.FAILED_PRECONDITION, text)
    # An empty list is refused before the model type is looked at.
    code, details = status_of(lambda: classifier.rerank.Rerank(pb.RerankRequest(query="q")))
    assert (code, details) == (Code.INVALID_ARGUMENT, "`texts` cannot be empty")


def test_splade_normalize_and_embed_all_are_failed_precondition(splade_grpc: Server) -> None:
    _, stubs = splade_grpc
    code, details = status_of(lambda: stubs.embed.Embed(pb.EmbedRequest(inputs="x")))
    assert code == Code.FAILED_PRECONDITION and "`normalize` is not available" in details
    dense = stubs.embed.Embed(pb.EmbedRequest(inputs="paris", normalize=False))
    assert len(dense.embeddings) == 30522
    code, details = status_of(lambda: stubs.embed.EmbedAll(pb.EmbedAllRequest(inputs="x")))
    assert code == Code.FAILED_PRECONDITION and "`embed_all` is not available" in details


def test_failed_forward_pass_is_failed_precondition(
    gated_grpc: tuple[LiveServer, Stubs, FaultyBackend],
) -> None:
    _, stubs, backend = gated_grpc
    backend.fail_if = lambda batch: True
    code, details = status_of(lambda: stubs.embed.Embed(pb.EmbedRequest(inputs="x")))
    backend.fail_if = None
    assert code == Code.FAILED_PRECONDITION
    assert details == "Backend error: injected fault"
    assert len(stubs.embed.Embed(pb.EmbedRequest(inputs="x")).embeddings) == 32


def test_unary_fails_fast_when_overloaded_while_streams_and_rerank_wait(
    gated_grpc: tuple[LiveServer, Stubs, FaultyBackend],
) -> None:
    srv, stubs, backend = gated_grpc
    admission = srv.infer.admission
    backend.gate.clear()
    with ThreadPoolExecutor(8) as pool:
        held = [
            pool.submit(stubs.embed.Embed, pb.EmbedRequest(inputs=f"held {i}")) for i in range(4)
        ]
        wait_for(lambda: admission.available == 0, "all 4 permits taken")
        for call in (
            lambda: stubs.embed.Embed(pb.EmbedRequest(inputs="one more")),
            lambda: stubs.embed.EmbedAll(pb.EmbedAllRequest(inputs="one more")),
        ):
            code, details = status_of(call)
            assert (code, details) == (Code.RESOURCE_EXHAUSTED, "Model is overloaded")
        streamed = pool.submit(
            lambda: list(
                stubs.embed.EmbedStream(iter([pb.EmbedRequest(inputs=f"s{i}") for i in range(6)]))
            )
        )
        wait_for(lambda: len(admission._waiters) > 0, "the stream waits for a permit")
        assert not streamed.done()
        backend.gate.set()
        assert all(len(f.result(60).embeddings) == 32 for f in held)
        assert len(streamed.result(60)) == 6
    assert admission.available == admission.capacity


def test_dead_worker_is_unavailable_and_health_follows(
    gated_grpc: tuple[LiveServer, Stubs, FaultyBackend],
) -> None:
    _, stubs, backend = gated_grpc
    health = health_pb2_grpc.HealthStub(stubs.channel)

    def status(service: str) -> int:
        return health.Check(health_pb2.HealthCheckRequest(service=service)).status

    serving = health_pb2.HealthCheckResponse.SERVING
    assert status("tei.v1.Embed") == serving
    backend.kill_next = True
    code, details = status_of(lambda: stubs.embed.Embed(pb.EmbedRequest(inputs="x")))
    assert (code, details) == (Code.UNAVAILABLE, "unhealthy")
    code, details = status_of(lambda: stubs.embed.Embed(pb.EmbedRequest(inputs="y")))
    assert (code, details) == (Code.UNAVAILABLE, "unhealthy")
    not_serving = health_pb2.HealthCheckResponse.NOT_SERVING
    wait_for(lambda: status("tei.v1.Embed") == not_serving, "Embed reported NOT_SERVING")
    assert status("tei.v1.Info") == serving and status("tei.v1.Tokenize") == serving
    # Info and Tokenize do not need the backend.
    assert stubs.info.Info(pb.InfoRequest()).max_concurrent_requests == 4
    assert len(stubs.tokenize.Tokenize(pb.EncodeRequest(inputs="hi")).tokens) == 1


def test_stream_error_ends_only_that_stream(minilm_grpc: Server) -> None:
    """Answers before the bad message arrive in order; then its status; others unaffected."""
    _, stubs = minilm_grpc
    texts = [f"message number {i}" for i in range(40)]
    bad_at = 25
    messages = [pb.EmbedRequest(inputs=t) for t in texts]
    messages[bad_at] = pb.EmbedRequest(inputs="")
    want = [list(stubs.embed.Embed(pb.EmbedRequest(inputs=t)).embeddings) for t in texts]
    got: list[list[float]] = []
    healthy: list[list[float]] = []
    other = threading.Thread(
        target=lambda: healthy.extend(
            list(r.embeddings)
            for r in stubs.embed.EmbedStream(iter(pb.EmbedRequest(inputs=t) for t in texts))
        )
    )
    other.start()
    with pytest.raises(grpc.RpcError) as err:
        for response in stubs.embed.EmbedStream(iter(messages)):
            got.append(list(response.embeddings))
    other.join(60)
    assert err.value.code() == Code.INVALID_ARGUMENT
    assert err.value.details() == "Input validation error: `inputs` cannot be empty"
    assert len(got) == bad_at
    for g, w in zip(got, want, strict=False):
        assert g == pytest.approx(w, abs=1e-5)
    assert len(healthy) == len(texts)


def test_malformed_messages_are_invalid_argument_in_their_slot(minilm_grpc: Server) -> None:
    _, stubs = minilm_grpc
    raw = {"request_serializer": lambda b: b}
    unary = stubs.channel.unary_unary(
        "/tei.v1.Embed/Embed", response_deserializer=pb.EmbedResponse.FromString, **raw
    )
    code, details = status_of(lambda: unary(b"\xff\xff\xff"))
    assert code == Code.INVALID_ARGUMENT
    assert "the message is not a valid tei.v1.EmbedRequest" in details
    stream = stubs.channel.stream_stream(
        "/tei.v1.Embed/EmbedStream", response_deserializer=pb.EmbedResponse.FromString, **raw
    )
    good = pb.EmbedRequest(inputs="fine").SerializeToString()
    answers: list[object] = []
    with pytest.raises(grpc.RpcError) as err:
        for response in stream(iter([good, good, b"\xff\xff", good])):
            answers.append(response)
    assert len(answers) == 2
    assert err.value.code() == Code.INVALID_ARGUMENT
    assert "not a valid tei.v1.EmbedRequest" in err.value.details()
    assert len(stubs.embed.Embed(pb.EmbedRequest(inputs="fine")).embeddings) == 384


def test_cancelled_stream_gives_its_permits_back(
    gated_grpc: tuple[LiveServer, Stubs, FaultyBackend],
) -> None:
    srv, stubs, backend = gated_grpc
    admission = srv.infer.admission
    backend.gate.clear()
    call = stubs.embed.EmbedStream(iter([pb.EmbedRequest(inputs=f"m{i}") for i in range(50)]))
    wait_for(lambda: admission.available == 0 and len(admission._waiters) > 0, "stream waits")
    call.cancel()
    backend.gate.set()
    wait_for(
        lambda: admission.available == admission.capacity and not admission._waiters,
        "every permit returned after the cancel",
    )
    assert len(stubs.embed.Embed(pb.EmbedRequest(inputs="after")).embeddings) == 32


def test_http_and_grpc_share_one_set_of_permits(
    gated_grpc: tuple[LiveServer, Stubs, FaultyBackend],
) -> None:
    """One process, one Infer: permits held by gRPC calls make HTTP answer 429, and back."""
    import httpx

    srv, stubs, backend = gated_grpc
    admission = srv.infer.admission
    backend.gate.clear()
    with ThreadPoolExecutor(4) as pool:
        held = [pool.submit(stubs.embed.Embed, pb.EmbedRequest(inputs=f"h{i}")) for i in range(4)]
        wait_for(lambda: admission.available == 0, "gRPC holds every permit")
        response = httpx.post(f"{srv.url}/embed", json={"inputs": "http"}, timeout=30)
        assert response.status_code == 429, response.text
        assert response.json()["error_type"] == "Overloaded"
        backend.gate.set()
        assert all(len(f.result(60).embeddings) == 32 for f in held)
    response = httpx.post(f"{srv.url}/embed", json={"inputs": "http"}, timeout=30)
    assert response.status_code == 200
    grpc_vector = stubs.embed.Embed(pb.EmbedRequest(inputs="http")).embeddings
    assert response.json()[0] == pytest.approx(list(grpc_vector), abs=1e-6)
