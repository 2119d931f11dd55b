"""One registry, one page per model: `Registry.render(model)` keeps that model's series and the
server-wide ones, with TEI's text format unchanged."""

from __future__ import annotations

from tests.observability.scrape import parse
from vectorpress.core.metrics import MetricDef, Metrics, Registry


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
