"""Streams under load: request order kept, permits waited for, never RESOURCE_EXHAUSTED."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from tests.grpc.clients import Stubs
from tests.helpers.server import LiveServer
from tests.helpers.texts import sentences
from vectorpress.api.grpc.stubs import pb
from vectorpress.settings import Settings

Server = tuple[LiveServer, Stubs]

STREAMS = 8
MESSAGES = 125  # per stream: 1,000 in all
# Short sentences: the test is about order and permits, not about compute.
POOL = [s for s in sentences() if 20 < len(s) < 70][:61]


def text_of(stream: int, i: int) -> int:
    # 61 is prime: neighbours in a stream always differ, and each stream has its own order.
    return (i * (stream + 2) + stream) % len(POOL)


def test_1000_messages_over_8_streams_keep_order_with_16_permits(minilm_grpc: Server) -> None:
    srv, stubs = minilm_grpc
    assert srv.infer.admission.capacity == 16
    reference = np.array(
        [list(stubs.embed.Embed(pb.EmbedRequest(inputs=t)).embeddings) for t in POOL]
    )

    def run(stream: int) -> np.ndarray:
        requests = (pb.EmbedRequest(inputs=POOL[text_of(stream, i)]) for i in range(MESSAGES))
        return np.array([list(r.embeddings) for r in stubs.embed.EmbedStream(requests)])

    with ThreadPoolExecutor(STREAMS) as pool:
        results = list(pool.map(run, range(STREAMS)))
    for stream, got in enumerate(results):
        assert got.shape == (MESSAGES, 384), f"stream {stream} answered {len(got)} messages"
        want = reference[[text_of(stream, i) for i in range(MESSAGES)]]
        cos = np.einsum("ij,ij->i", got, want)
        worst = int(np.argmin(cos))
        assert cos[worst] > 0.99999, (
            f"stream {stream} message {worst}: cosine {cos[worst]:.6f} with its own text; "
            "an answer is out of order or wrong"
        )
    assert srv.infer.admission.available == 16


def test_one_message_in_flight_per_stream_still_answers_all(
    tiny_bert_family: Callable[..., Path],
) -> None:
    """GRPC_MAX_PARALLEL_STREAM_REQUESTS=1 turns a stream into request/response, in order."""
    folder = tiny_bert_family(task="reranker")
    settings = Settings.single(str(folder), grpc_max_parallel_stream_requests=1)
    with LiveServer(settings, grpc=True) as srv:
        stubs = Stubs.connect(srv.grpc_target)
        texts = POOL[:20]
        want = [
            stubs.predict.Predict(pb.PredictRequest(inputs=t)).predictions[0].score for t in texts
        ]
        requests = iter(pb.PredictRequest(inputs=t) for t in texts)
        got = [r.predictions[0].score for r in stubs.predict.PredictStream(requests)]
        stubs.channel.close()
    assert got == want


def _settled(read: Callable[[], float], before: float) -> float:
    """A counter recorded on the loop's next turn: its value once it has moved (or 5 s on)."""
    deadline = time.monotonic() + 5
    while read() == before and time.monotonic() < deadline:
        time.sleep(0.01)
    return read()


def test_a_rerank_stream_is_one_request_in_the_metrics(reranker_grpc: Server) -> None:
    """As TEI: te_request_count and te_request_success once per stream, as a batch; the
    per-input counters once per message."""
    srv, stubs = reranker_grpc
    metrics = srv.infer.metrics
    count = {m: metrics.value("te_request_count", method=m) for m in ("single", "batch")}
    success = metrics.value("te_request_success", method="batch")
    inputs = metrics.value("te_predict_count")
    texts = ["alpha", "beta", "gamma", "delta"]
    reply = stubs.rerank.RerankStream(
        iter(pb.RerankStreamRequest(query="q", text=t) for t in texts)
    )
    assert sorted(r.index for r in reply.ranks) == [0, 1, 2, 3]
    assert metrics.value("te_request_count", method="batch") == count["batch"] + 1
    assert metrics.value("te_request_count", method="single") == count["single"]
    read = lambda: metrics.value("te_request_success", method="batch")  # noqa: E731
    assert _settled(read, success) == success + 1
    assert metrics.value("te_predict_count") == inputs + len(texts)
