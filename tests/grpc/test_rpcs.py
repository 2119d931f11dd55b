"""Every tei.v1 RPC over a real port, with stubs generated from the packaged tei.proto."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.grpc.clients import Stubs, splade_path
from tests.grpc.reference import hf_logits, sigmoid, softmax
from tests.helpers.reference import assert_close_vectors
from tests.helpers.server import TIMING_HEADERS, LiveServer
from tests.helpers.texts import mixed_texts
from vectorpress import __version__
from vectorpress.api.grpc.stubs import pb

TEXTS = mixed_texts(12, seed=5, long_share=0.0)
QUERY = "How do I read a file line by line?"
PASSAGES = [
    "Open the file and iterate over it; each iteration yields one line.",
    "The weather in Paris is mild in spring.",
    "Use readline() in a loop until it returns an empty string.",
    "Stock markets fell sharply on Monday.",
]

Server = tuple[LiveServer, Stubs]


def http_embed(srv: LiveServer, inputs: list[str], **extra: object) -> list[list[float]]:
    body = {"inputs": inputs, "truncate": False, **extra}
    response = httpx.post(f"{srv.url}/embed", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


# -- Info ------------------------------------------------------------------------------------


def test_info(minilm_grpc: Server) -> None:
    srv, stubs = minilm_grpc
    info = stubs.info.Info(pb.InfoRequest())
    assert info.version == __version__
    assert info.model_id == srv.settings.model.model_id
    assert info.model_type == pb.MODEL_TYPE_EMBEDDING
    assert info.model_dtype == "float32"
    assert info.max_concurrent_requests == 16
    assert info.max_input_length == 256
    assert info.max_batch_tokens == 4096
    assert info.max_client_batch_size == 32
    assert info.tokenization_workers >= 1
    assert not info.HasField("sha") and not info.HasField("model_sha")


def test_info_model_types(reranker_grpc: Server, classifier_grpc: Server) -> None:
    assert reranker_grpc[1].info.Info(pb.InfoRequest()).model_type == pb.MODEL_TYPE_RERANKER
    kind = classifier_grpc[1].info.Info(pb.InfoRequest()).model_type
    assert kind == pb.MODEL_TYPE_CLASSIFIER


# -- Embed -----------------------------------------------------------------------------------


def test_embed_equals_http_embed(minilm_grpc: Server) -> None:
    srv, stubs = minilm_grpc
    got = [list(stubs.embed.Embed(pb.EmbedRequest(inputs=t)).embeddings) for t in TEXTS]
    want = http_embed(srv, TEXTS)
    assert_close_vectors(got, want, min_cos=0.99999, max_abs=1e-5, what="grpc vs http")
    assert all(abs(np.linalg.norm(v) - 1) < 1e-5 for v in got), "absent normalize means true"


def test_embed_options(minilm_grpc: Server) -> None:
    srv, stubs = minilm_grpc
    text = TEXTS[0]
    raw = stubs.embed.Embed(pb.EmbedRequest(inputs=text, normalize=False)).embeddings
    assert_close_vectors([raw], http_embed(srv, [text], normalize=False), max_abs=1e-5)
    assert abs(np.linalg.norm(raw) - 1) > 1e-3
    short = stubs.embed.Embed(pb.EmbedRequest(inputs=text, dimensions=128)).embeddings
    assert len(short) == 128 and abs(np.linalg.norm(short) - 1) < 1e-5
    assert_close_vectors([short], http_embed(srv, [text], dimensions=128), max_abs=1e-5)


def test_embed_metadata_and_timing_headers(minilm_grpc: Server) -> None:
    _, stubs = minilm_grpc
    response, call = stubs.embed.Embed.with_call(pb.EmbedRequest(inputs="hello"))
    meta = response.metadata
    assert meta.compute_chars == 5 and meta.compute_tokens == 3
    assert meta.total_time_ns >= meta.inference_time_ns > 0
    headers = dict(call.initial_metadata())
    assert headers.keys() >= set(TIMING_HEADERS)
    assert headers["x-compute-type"] == "gpu+optimized"
    assert headers["x-compute-characters"] == "5" and headers["x-compute-tokens"] == "3"


def test_truncate_defaults_to_false_and_can_be_asked_for(minilm_grpc: Server) -> None:
    import grpc

    _, stubs = minilm_grpc
    long_text = " ".join(["word"] * 400)
    with pytest.raises(grpc.RpcError) as err:
        stubs.embed.Embed(pb.EmbedRequest(inputs=long_text))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "must have less than 256 tokens" in err.value.details()
    ok = stubs.embed.Embed(pb.EmbedRequest(inputs=long_text, truncate=True))
    assert ok.metadata.compute_tokens == 256
    left = stubs.embed.Embed(
        pb.EmbedRequest(
            inputs="alpha " + long_text,
            truncate=True,
            truncation_direction=pb.TRUNCATION_DIRECTION_LEFT,
        )
    )
    assert left.metadata.compute_tokens == 256


def test_embed_stream_equals_unary(minilm_grpc: Server) -> None:
    _, stubs = minilm_grpc
    requests = [pb.EmbedRequest(inputs=t) for t in TEXTS]
    streamed = [list(r.embeddings) for r in stubs.embed.EmbedStream(iter(requests))]
    unary = [list(stubs.embed.Embed(r).embeddings) for r in requests]
    assert_close_vectors(streamed, unary, min_cos=0.99999, max_abs=1e-5, what="stream")


def test_embed_all_mean_is_the_pooled_vector(minilm_grpc: Server) -> None:
    """all-MiniLM-L6-v2 mean-pools: the mean of EmbedAll's token rows, normalized, is Embed."""
    _, stubs = minilm_grpc
    for text in TEXTS[:3]:
        tokens = stubs.embed.EmbedAll(pb.EmbedAllRequest(inputs=text)).token_embeddings
        ids = stubs.tokenize.Tokenize(pb.EncodeRequest(inputs=text, add_special_tokens=True))
        assert len(tokens) == len(ids.tokens)
        rows = np.array([list(t.embeddings) for t in tokens])
        assert rows.shape[1] == 384
        mean = rows.mean(axis=0)
        pooled = stubs.embed.Embed(pb.EmbedRequest(inputs=text)).embeddings
        assert_close_vectors([mean / np.linalg.norm(mean)], [pooled], max_abs=1e-5)
    stream = list(
        stubs.embed.EmbedAllStream(iter([pb.EmbedAllRequest(inputs=t) for t in TEXTS[:3]]))
    )
    assert [len(r.token_embeddings) for r in stream] == [
        len(stubs.embed.EmbedAll(pb.EmbedAllRequest(inputs=t)).token_embeddings) for t in TEXTS[:3]
    ]


def test_embed_sparse_golden_dot_products(splade_grpc: Server) -> None:
    _, stubs = splade_grpc
    texts = [
        "what is the weather like in paris",
        "Paris is sunny today with mild temperatures.",
        "Stock markets fell sharply on Monday.",
    ]
    unary = [stubs.embed.EmbedSparse(pb.EmbedSparseRequest(inputs=t)) for t in texts]
    streamed = list(
        stubs.embed.EmbedSparseStream(iter([pb.EmbedSparseRequest(inputs=t) for t in texts]))
    )

    def dense(response: object) -> np.ndarray:
        v = np.zeros(30522)
        values = response.sparse_embeddings  # type: ignore[attr-defined]
        indices = [s.index for s in values]
        assert indices == sorted(indices) and all(s.value > 0 for s in values)
        v[indices] = [s.value for s in values]
        return v

    q, good, bad = (dense(r) for r in unary)
    assert abs(q @ good - 17.59) < 0.01
    assert q @ bad == 0.0
    for a, b in zip(unary, streamed, strict=True):
        assert np.allclose(dense(a), dense(b), atol=1e-5)
    assert splade_path().is_dir()


# -- Predict and Rerank ----------------------------------------------------------------------


def test_reranker_predict_and_predict_pair(reranker_grpc: Server, tiny_bert_family: object) -> None:
    srv, stubs = reranker_grpc
    folder = Path(srv.settings.model.model_id)
    pairs = [(QUERY, p) for p in PASSAGES]
    logits = hf_logits(folder, [QUERY, *pairs])[:, 0]
    single = stubs.predict.Predict(pb.PredictRequest(inputs=QUERY))
    assert len(single.predictions) == 1
    assert abs(single.predictions[0].score - sigmoid(logits[0])) < 1e-5
    raw = stubs.predict.Predict(pb.PredictRequest(inputs=QUERY, raw_scores=True))
    assert abs(raw.predictions[0].score - logits[0]) < 1e-4
    one = stubs.predict.PredictPair(pb.PredictPairRequest(inputs=[QUERY]))
    assert one.predictions[0].score == single.predictions[0].score
    for (q, p), want in zip(pairs, logits[1:], strict=True):
        got = stubs.predict.PredictPair(pb.PredictPairRequest(inputs=[q, p]))
        assert abs(got.predictions[0].score - sigmoid(want)) < 1e-5
        assert got.metadata.compute_tokens > 0
    streamed = list(
        stubs.predict.PredictPairStream(
            iter([pb.PredictPairRequest(inputs=[q, p]) for q, p in pairs])
        )
    )
    assert [r.predictions[0].score for r in streamed] == pytest.approx(
        sigmoid(logits[1:]).tolist(), abs=1e-5
    )
    texts = [QUERY, *PASSAGES]
    streamed_single = list(
        stubs.predict.PredictStream(iter([pb.PredictRequest(inputs=t) for t in texts]))
    )
    want_single = hf_logits(folder, texts)[:, 0]
    assert [r.predictions[0].score for r in streamed_single] == pytest.approx(
        sigmoid(want_single).tolist(), abs=1e-5
    )


def test_classifier_predict_sorted_softmax(classifier_grpc: Server) -> None:
    srv, stubs = classifier_grpc
    folder = Path(srv.settings.model.model_id)
    want = softmax(hf_logits(folder, [TEXTS[0], (QUERY, PASSAGES[0])]))
    labels = ["negative", "neutral", "positive"]
    for response, probs in (
        (stubs.predict.Predict(pb.PredictRequest(inputs=TEXTS[0])), want[0]),
        (stubs.predict.PredictPair(pb.PredictPairRequest(inputs=[QUERY, PASSAGES[0]])), want[1]),
    ):
        scores = [p.score for p in response.predictions]
        assert scores == sorted(scores, reverse=True)
        got = {p.label: p.score for p in response.predictions}
        assert set(got) == set(labels)
        for i, label in enumerate(labels):
            assert abs(got[label] - probs[i]) < 1e-5


def test_rerank_unary_and_stream(reranker_grpc: Server) -> None:
    srv, stubs = reranker_grpc
    folder = Path(srv.settings.model.model_id)
    want = sigmoid(hf_logits(folder, [(QUERY, p) for p in PASSAGES])[:, 0])
    response, call = stubs.rerank.Rerank.with_call(
        pb.RerankRequest(query=QUERY, texts=PASSAGES, return_text=True)
    )
    ranks = list(response.ranks)
    assert sorted(r.index for r in ranks) == list(range(len(PASSAGES)))
    assert [r.score for r in ranks] == sorted((r.score for r in ranks), reverse=True)
    for r in ranks:
        assert abs(r.score - want[r.index]) < 1e-5
        assert r.text == PASSAGES[r.index]
    assert dict(call.initial_metadata()).keys() >= set(TIMING_HEADERS)
    bare = stubs.rerank.Rerank(pb.RerankRequest(query=QUERY, texts=PASSAGES))
    assert not any(r.HasField("text") for r in bare.ranks)

    messages = [
        pb.RerankStreamRequest(query=QUERY, text=p, return_text=(i == 0))
        for i, p in enumerate(PASSAGES)
    ]
    streamed = stubs.rerank.RerankStream(iter(messages))
    assert [(r.index, r.text) for r in streamed.ranks] == [(r.index, r.text) for r in ranks]
    assert [r.score for r in streamed.ranks] == pytest.approx([r.score for r in ranks], abs=1e-6)
    assert streamed.metadata.compute_tokens == response.metadata.compute_tokens


# -- Tokenize and Decode ---------------------------------------------------------------------


def test_tokenize_and_decode(minilm_grpc: Server) -> None:
    srv, stubs = minilm_grpc
    plain = stubs.tokenize.Tokenize(pb.EncodeRequest(inputs="Hello, wörld"))
    special = stubs.tokenize.Tokenize(
        pb.EncodeRequest(inputs="Hello, wörld", add_special_tokens=True)
    )
    tokenizer = srv.infer.tokenizers._new_tokenizer()
    assert [t.id for t in special.tokens] == tokenizer.encode("Hello, wörld").ids
    # add_special_tokens is a plain proto bool: absent means false.
    assert [t.id for t in plain.tokens] == [t.id for t in special.tokens][1:-1]
    cls = special.tokens[0]
    assert cls.special and cls.text == "[CLS]" and not cls.HasField("start")
    word = special.tokens[-2]
    assert (word.start, word.stop) == (7, 13), "byte offsets: ö is two bytes"
    ids = [t.id for t in special.tokens]
    decoded = stubs.tokenize.Decode(pb.DecodeRequest(ids=ids, skip_special_tokens=True))
    assert decoded.text == "hello, world"
    kept = stubs.tokenize.Decode(pb.DecodeRequest(ids=ids))
    assert kept.text.startswith("[CLS]") and kept.text.endswith("[SEP]")
    texts = ["one", "two words", "three more words"]
    streamed = list(stubs.tokenize.TokenizeStream(iter(pb.EncodeRequest(inputs=t) for t in texts)))
    assert [len(r.tokens) for r in streamed] == [1, 2, 3]
    decoded_stream = list(
        stubs.tokenize.DecodeStream(
            iter(
                pb.DecodeRequest(ids=[t.id for t in r.tokens], skip_special_tokens=True)
                for r in streamed
            )
        )
    )
    assert [r.text for r in decoded_stream] == texts
