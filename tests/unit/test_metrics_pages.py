"""One registry, one page per model: `Registry.render(model)` keeps that model's series and the
server-wide ones, with TEI's text format unchanged."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from tests.observability.scrape import parse
from vectorpress.core.infer import Infer, Result
from vectorpress.core.metrics import MetricDef, Metrics, Registry
from vectorpress.types import Timings


def test_a_models_page_keeps_its_series_and_the_server_wide_ones() -> None:
    registry = Registry()
    a, b = Metrics(256, "a", registry), Metrics(512, "b", registry)
    a.inc("te_request_success")
    b.inc("te_request_success", 3)
    registry.define(MetricDef("vectorpress_server_wide", "gauge", "No model label"))
    registry.set("vectorpress_server_wide", (), 7.0)

    whole = parse(registry.render())
    page = parse(registry.render("a"))
    assert whole.get("te_request_success", model="b") == 3
    assert page.get("te_request_success", model="a") == 1
    assert not page.has("te_request_success", model="b")
    assert {dict(k).get("model") for _, k in page.samples} == {"a", None}
    assert page.get("vectorpress_server_wide") == 7
    # The model's own series are exactly the whole page's.
    assert set(page.samples) == {k for k in whole.samples if dict(k[1]).get("model") in ("a", None)}
    assert parse(registry.render("nobody")).samples.keys() == {("vectorpress_server_wide", ())}


def test_many_observations_and_increments_in_one_call_make_the_same_page() -> None:
    one, many = Metrics(model="m"), Metrics(model="m")
    values = [
        ("te_request_duration", 0.003),
        ("te_request_input_length", 7.0),
        ("te_request_duration", 12.0),
        ("te_batch_next_tokens", 0.0),
    ]
    counts = [("vectorpress_tokens", 7.0), ("vectorpress_tokens", 2.0), ("te_embed_count", 1.0)]
    for name, value in values:
        one.observe(name, value)
    for name, value in counts:
        one.inc(name, value)
    many.observe_many(values)
    many.inc_many(counts)
    assert many.render() == one.render()
    assert many.value("vectorpress_tokens") == 9.0


def test_each_stage_timing_lands_in_its_own_histogram() -> None:
    metrics = Metrics(model="m")
    owner = SimpleNamespace(metrics=metrics)
    timings = Timings(tokenization=0.001, queue=0.02, inference=0.3)
    Infer._record_request(owner, "single", Result(None, timings=timings, total_time=4.0))  # type: ignore[arg-type]
    entries = [SimpleNamespace(queue_time=0.05, inference_time=0.6)] * 2
    Infer._record_run(owner, "embed", entries, 0.007, 8.0)  # type: ignore[arg-type]
    page = parse(metrics.render())
    for prefix, want in (
        ("te_request", {"": 4.0, "_tokenization": 0.001, "_queue": 0.02, "_inference": 0.3}),
        ("te_embed", {"": 16.0, "_tokenization": 0.014, "_queue": 0.1, "_inference": 1.2}),
    ):
        for stage, total in want.items():
            assert page.get(f"{prefix}{stage}_duration_sum", model="m") == pytest.approx(total)
    assert page.get("te_embed_success", model="m") == 2


def test_records_wait_for_a_fold_and_every_read_sees_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from vectorpress.core import metrics as metrics_module

    monkeypatch.setattr(metrics_module, "FOLD_AT", 4)
    registry = Registry()
    metrics = Metrics(model="m", registry=registry)
    metrics.inc("te_request_count", method="single")
    metrics.observe_many([("te_request_duration", 0.5), ("te_request_input_length", 9.0)])
    # Below FOLD_AT an ended request leaves them waiting; reads fold first.
    metrics.fold_due()
    assert len(registry._pending) == 2
    assert metrics.value("te_request_count", method="single") == 1
    assert not registry._pending
    metrics.inc("te_embed_count", 3)
    page = parse(registry.render())
    assert page.get("te_embed_count", model="m") == 3
    assert page.get("te_request_duration_sum", model="m") == pytest.approx(0.5)
    assert page.get("te_request_input_length_count", model="m") == 1
    # At FOLD_AT an ended request folds them.
    for _ in range(4):
        metrics.inc("vectorpress_tokens", 2)
    metrics.fold_due()
    assert not registry._pending
    metrics.set("vectorpress_tokens", 1.0)
    metrics.inc("vectorpress_tokens", 5)
    assert metrics.value("vectorpress_tokens") == 6.0  # set applies after what waited before it


def test_a_record_of_an_undefined_histogram_fails_no_fold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = Registry()
    metrics = Metrics(model="m", registry=registry)
    for _ in range(2):
        metrics.observe_many(
            [("te_request_duration", 0.5), ("no_such_histogram", 1.0), ("te_batch_next_size", 3.0)]
        )
        metrics.inc("te_embed_count")
    with caplog.at_level(logging.ERROR, logger="vectorpress.core.metrics"):
        page = parse(registry.render())
        metrics.observe("no_such_histogram", 2.0)
        metrics.fold_due()
        registry.fold()
    # Everything else recorded around it is on the page; the name itself is said once.
    assert page.get("te_request_duration_count", model="m") == 2
    assert page.get("te_batch_next_size_sum", model="m") == 6.0
    assert page.get("te_embed_count", model="m") == 2
    assert "no_such_histogram" not in registry.render()
    assert [r.getMessage() for r in caplog.records] == [
        "no histogram is defined as 'no_such_histogram': its values are dropped"
    ]


def test_records_never_pile_up_past_their_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from vectorpress.core import metrics as metrics_module

    monkeypatch.setattr(metrics_module, "PENDING_MAX", 10)
    registry = Registry()
    metrics = Metrics(model="m", registry=registry)
    for _ in range(95):  # nobody reads and no request ends: recording alone bounds them
        metrics.inc("vectorpress_tokens", 1)
        assert len(registry._pending) < 10
    assert metrics.value("vectorpress_tokens") == 95


def test_records_from_many_threads_during_folds_are_all_counted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import sys
    import threading

    from vectorpress.core import metrics as metrics_module

    monkeypatch.setattr(metrics_module, "FOLD_AT", 1)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, inside folds too
    try:
        metrics = Metrics(model="m")
        threads, per_thread = 4, 5000

        def record() -> None:
            for i in range(per_thread):
                metrics.inc("vectorpress_tokens", 1)
                metrics.observe_many([("te_request_input_length", 1.0)])
                if i % 7 == 0:
                    metrics.fold_due()

        workers = [threading.Thread(target=record) for _ in range(threads)]
        for worker in workers:
            worker.start()
        while any(w.is_alive() for w in workers):
            metrics.render()
        for worker in workers:
            worker.join()
    finally:
        sys.setswitchinterval(interval)
    page = parse(metrics.render())
    assert page.get("vectorpress_tokens", model="m") == threads * per_thread
    assert page.get("te_request_input_length_count", model="m") == threads * per_thread
