"""/metrics after known traffic, scraped from a real server and read with prometheus_client."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np

from tests.helpers.faulty import faulty_factory, leave_while_queued
from tests.helpers.server import LiveServer
from tests.helpers.texts import sentences
from tests.observability.scrape import parse, scrape
from vectorpress.core.metrics import FAILURE_KINDS, Metrics, tei_defs
from vectorpress.settings import Settings
from vectorpress.types import Batch, Encoding

#: Spec section 4: every TEI metric and its type.
TEI_TYPES = {
    "te_request_count": "counter",
    "te_request_success": "counter",
    "te_request_failure": "counter",
    "te_embed_count": "counter",
    "te_embed_success": "counter",
    "te_predict_count": "counter",
    "te_predict_success": "counter",
    "te_request_input_length": "histogram",
    "te_batch_next_size": "histogram",
    "te_batch_next_tokens": "histogram",
    "te_queue_size": "gauge",
    **{
        f"te_{family}_{stage}duration": "histogram"
        for family in ("request", "embed", "predict")
        for stage in ("", "tokenization_", "queue_", "inference_")
    },
}

KEY = "metrics-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def test_every_tei_metric_with_counts_matching_the_traffic(
    tiny_bert_family: Callable[..., Path],
) -> None:
    folder = tiny_bert_family("bert", "embedding", "mean")
    settings = Settings.single(
        model_id=str(folder), max_concurrent_requests=4, api_key=KEY, served_model_name="tiny"
    )
    texts = sentences()[:20]
    long_text = " ".join(texts) * 4  # far over the 128-token limit: truncated
    with LiveServer(settings) as srv:
        before = scrape(f"{srv.url}/metrics")  # no key needed, and complete before any traffic
        assert set(TEI_TYPES) <= set(before.types)
        assert before.get("te_request_count", method="single") == 0

        def embed(payload: dict[str, object]) -> httpx.Response:
            return httpx.post(f"{srv.url}/embed", json=payload, headers=AUTH, timeout=60)

        ok = [embed({"inputs": t}) for t in texts[:3]]
        ok += [embed({"inputs": texts[3 + 4 * i : 7 + 4 * i]}) for i in range(2)]
        ok.append(embed({"inputs": long_text}))
        ok.append(embed({"inputs": [texts[12]]}))  # a list of one is a batch request, as TEI
        assert [r.status_code for r in ok] == [200] * 7
        tokens = sum(int(r.headers["x-compute-tokens"]) for r in ok)

        failed = {
            "batch_size": embed({"inputs": texts[:1] * 33}),
            "validation": embed({"inputs": texts[0], "dimensions": 0}),
            "overloaded": embed({"inputs": texts[:5]}),
            # Whatever fails while tokenizing counts as tokenization, as in TEI.
            "tokenization": embed({"inputs": long_text, "truncate": False}),
        }
        assert [r.status_code for r in failed.values()] == [422, 422, 429, 422]
        assert embed({"inputs": ""}).status_code == 400
        too_long = httpx.post(
            f"{srv.url}/tokenize", json={"inputs": "x" * 40_000}, headers=AUTH, timeout=60
        )
        assert too_long.status_code == 422, too_long.text
        page = scrape(f"{srv.url}/metrics")

    for name, kind in TEI_TYPES.items():
        assert page.types.get(name) == kind, f"{name}: {page.types.get(name)} != {kind}"

    inputs = 3 + 8 + 1 + 1
    assert page.get("te_request_count", method="single") == 3 + 1 + 3
    assert page.get("te_request_count", method="batch") == 3 + 2
    assert page.get("te_request_success", method="single") == 4
    assert page.get("te_request_success", method="batch") == 3
    for kind in FAILURE_KINDS:
        want = {"tokenization": 3}.get(kind, 1 if kind in failed else 0)
        assert page.get("te_request_failure", err=kind) == want, kind
    assert page.get("te_request_duration_count") == 7
    assert page.get("te_request_queue_duration_count") == 7
    assert page.get("te_embed_count") == inputs + 2  # the two that failed while tokenizing
    assert page.get("te_embed_success") == inputs
    for stage in ("", "tokenization_", "queue_", "inference_"):
        assert page.get(f"te_embed_{stage}duration_count") == inputs
    assert page.get("te_predict_count") == 0
    assert page.get("te_request_input_length_count") == inputs
    assert page.get("te_request_input_length_sum") == tokens
    assert page.get("te_batch_next_size_sum") == inputs
    assert page.get("te_batch_next_tokens_sum") == tokens
    assert page.get("te_queue_size") == 0

    # TEI's buckets: durations from 1.5e-5 s by a factor of 1.5 (computed as TEI computes
    # them, so the label is TEI's to the last digit), lengths up to the input limit.
    assert page.get("te_request_duration_bucket", le="0.000015000000000000002") == 0
    assert page.get("te_request_duration_bucket", le="+Inf") == 7
    assert page.get("te_request_input_length_bucket", le="128") == inputs
    assert not page.has("te_request_input_length_bucket", le="256")
    # With one model too, every series names it.
    assert all(dict(key).get("model") == "tiny" for _, key in page.samples)

    # Beyond TEI.
    assert page.get("vectorpress_truncated_inputs") == 1
    assert page.get("vectorpress_tokens", model="tiny") == tokens
    assert page.get("vectorpress_batch_real_tokens") == tokens
    assert page.get("vectorpress_batch_computed_tokens") == tokens  # packed: no padding
    batches = page.get("te_batch_next_size_count")
    assert page.get("vectorpress_batch_padding_efficiency_count") == batches
    assert page.get("vectorpress_batch_padding_efficiency_sum") == batches
    assert page.get("vectorpress_tokens_per_second", model="tiny") > 0
    assert page.get("vectorpress_backend_busy_seconds") > 0
    assert page.types["vectorpress_info"] == "gauge"
    info = {k: v for (n, k), v in page.samples.items() if n == "vectorpress_info"}
    assert list(info.values()) == [1.0]
    labels = dict(next(iter(info)))
    assert labels["backend"] == "torch" and labels["dtype"] == "float32"
    assert labels["device"] == "cpu" and labels["model"] == "tiny"


def test_predict_traffic_counts_each_request_once(tiny_bert_family: Callable[..., Path]) -> None:
    folder = tiny_bert_family("bert", "classifier")
    with LiveServer(Settings.single(str(folder))) as srv:
        single = httpx.post(f"{srv.url}/predict", json={"inputs": "one text"}, timeout=60)
        batch = httpx.post(
            f"{srv.url}/predict", json={"inputs": [["a"], ["b"], ["c", "d"]]}, timeout=60
        )
        assert single.status_code == 200 and batch.status_code == 200, batch.text
        wrong = httpx.post(f"{srv.url}/embed", json={"inputs": "x"}, timeout=60)
        assert wrong.status_code == 424
        page = scrape(f"{srv.url}/metrics")
    # TEI counts a single /predict twice; here each request counts once.
    assert page.get("te_request_count", method="single") == 2
    assert page.get("te_request_count", method="batch") == 1
    assert page.get("te_request_failure", err="model_type") == 1
    assert page.get("te_predict_count") == 4 and page.get("te_predict_success") == 4
    assert page.get("te_predict_duration_count") == 4
    assert page.get("te_embed_count") == 0


def test_rerank_is_a_batch_request_whatever_its_size(
    tiny_bert_family: Callable[..., Path],
) -> None:
    folder = tiny_bert_family("bert", "reranker")
    with LiveServer(Settings.single(str(folder))) as srv:
        for texts in (["only one"], ["one", "two", "three"]):
            response = httpx.post(
                f"{srv.url}/rerank", json={"query": "q", "texts": texts}, timeout=60
            )
            assert response.status_code == 200, response.text
        page = scrape(f"{srv.url}/metrics")
    assert page.get("te_request_count", method="batch") == 2
    assert page.get("te_request_count", method="single") == 0
    assert page.get("te_predict_count") == 4 and page.get("te_predict_success") == 4


def _batch(lengths: list[int]) -> Batch:
    return Batch.from_encodings([Encoding(ids=[1] * n, type_ids=[0] * n) for n in lengths])


def test_padding_efficiency_of_a_padded_backend() -> None:
    metrics = Metrics(128, "m")
    metrics.record_batch(_batch([2, 6]), 0.01, padded=True, ok=True)
    metrics.record_batch(_batch([4, 4]), 0.01, padded=True, ok=True)
    metrics.record_batch(_batch([3]), 0.01, padded=True, ok=False)
    page = parse(metrics.render())
    assert page.get("vectorpress_batch_real_tokens") == 16
    assert page.get("vectorpress_batch_computed_tokens") == 20
    assert np.isclose(page.get("vectorpress_batch_padding_efficiency_sum"), 8 / 12 + 1.0)
    assert page.get("vectorpress_batch_padding_efficiency_bucket", le="0.7") == 1
    assert page.get("vectorpress_batch_failures") == 1
    assert np.isclose(page.get("vectorpress_backend_busy_seconds"), 0.02)
    # A failed batch was still formed: TEI's batch histograms count it.
    assert page.get("te_batch_next_size_count") == 3


def test_bucket_bounds_are_teis() -> None:
    defs = tei_defs(512)
    bounds = defs["te_request_duration"].buckets
    assert len(bounds) == 35 and np.isclose(bounds[0], 1.5e-5)
    assert all(np.isclose(b / a, 1.5) for a, b in itertools.pairwise(bounds))
    assert defs["te_request_input_length"].buckets[-1] == 512
    assert defs["te_batch_next_size"].buckets[-1] == 4096
    assert defs["te_batch_next_tokens"].buckets[-1] == 2**20


def test_a_gone_client_counts_as_one_dropped_request_and_input(
    tiny_bert_family: Callable[..., Path],
) -> None:
    make, made = faulty_factory()
    folder = tiny_bert_family("bert", "embedding", "mean")
    with LiveServer(Settings.single(str(folder), max_batch_requests=1), make) as srv:
        backend = made[0]
        backend.delay = 1.0

        assert leave_while_queued(srv.url, "never computed") == 200
        backend.delay = 0.0
        page = scrape(f"{srv.url}/metrics")
    assert page.get("te_request_failure", err="dropped") == 1
    assert page.get("vectorpress_dropped_inputs") == 1
    assert page.get("te_request_count", method="single") == 2
    assert page.get("te_request_success", method="single") == 1
    assert page.get("te_batch_next_size_sum") == 1


def test_health_probes_after_a_failure_are_not_batches(
    tiny_bert_family: Callable[..., Path],
) -> None:
    """After a failed batch /health runs a one-token forward; TEI's health check never forms a
    batch, so te_batch_next_* count only the requests' batches."""
    make, made = faulty_factory()
    folder = tiny_bert_family("bert", "embedding", "mean")
    with LiveServer(Settings.single(str(folder)), make) as srv:
        backend = made[0]
        backend.fail_if = lambda batch: True
        failed = httpx.post(f"{srv.url}/embed", json={"inputs": "fails"}, timeout=60)
        assert failed.status_code == 424
        backend.fail_if = None
        runs = len(backend.batches)
        assert httpx.get(f"{srv.url}/health", timeout=60).status_code == 200
        assert backend.batches[runs:] == [[[0]]]  # the probe ran, through the device thread
        assert httpx.post(f"{srv.url}/embed", json={"inputs": "works"}, timeout=60).is_success
        page = scrape(f"{srv.url}/metrics")
    assert page.get("te_batch_next_size_count") == 2
    assert page.get("te_batch_next_size_sum") == 2
    tokens = srv.infer.tokenizers._new_tokenizer()
    expected = len(tokens.encode("fails").ids) + len(tokens.encode("works").ids)
    assert page.get("te_batch_next_tokens_sum") == expected


def test_a_probe_in_a_batch_leaves_the_others_counted() -> None:
    metrics = Metrics(128, "m")
    probe = Encoding(ids=[0], type_ids=[0], probe=True)
    metrics.record_batch(Batch.from_encodings([probe]), 0.01, padded=False, ok=True)
    real = Encoding(ids=[1] * 5, type_ids=[0] * 5)
    metrics.record_batch(Batch.from_encodings([real, probe]), 0.01, padded=False, ok=True)
    page = parse(metrics.render())
    assert page.get("te_batch_next_size_count") == 1
    assert page.get("te_batch_next_size_sum") == 1
    assert page.get("te_batch_next_tokens_sum") == 5
    assert page.get("vectorpress_batch_real_tokens") == 5
