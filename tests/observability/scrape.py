"""Read a Prometheus text page with prometheus_client's own parser."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Page:
    types: dict[str, str]
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]

    def matching(self, name: str, **labels: str) -> list[float]:
        """The samples of `name` whose labels include `labels`, as a PromQL selector picks
        them (so a query written for TEI, without the `model` label, still matches)."""
        want = set(labels.items())
        return [v for (n, key), v in self.samples.items() if n == name and want <= set(key)]

    def has(self, name: str, **labels: str) -> bool:
        return bool(self.matching(name, **labels))

    def get(self, name: str, **labels: str) -> float:
        """The sum over the matching samples (over every model unless `model` is given)."""
        found = self.matching(name, **labels)
        assert found, f"no sample {name}{labels}"
        return sum(found)


def parse(text: str) -> Page:
    types: dict[str, str] = {}
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            name = sample.name
            # The parser reports counters under `<name>_total`; TEI's names have no suffix.
            if family.type == "counter" and name == f"{family.name}_total":
                name = family.name
            samples[(name, tuple(sorted(sample.labels.items())))] = sample.value
    return Page(types, samples)


def scrape(url: str) -> Page:
    response = httpx.get(url, timeout=30)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text)
