"""Read a Prometheus text page with prometheus_client's own parser."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families


@dataclass
class Page:
    types: dict[str, str]
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]

    def get(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        assert key in self.samples, f"no sample {name}{labels}"
        return self.samples[key]


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
