"""Prometheus metrics with TEI's names, types, labels and buckets, defined once.

TEI renders counters without the `_total` suffix that prometheus_client would add, and Grafana
dashboards built for TEI query those exact names, so this module keeps its own small registry
and writes the text exposition format itself.
"""

from __future__ import annotations

import bisect
import math
import threading
from dataclasses import dataclass, field

_DURATION_BUCKETS = tuple(1.5e-5 * 1.5**i for i in range(35))


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: str  # counter, gauge or histogram
    help: str
    buckets: tuple[float, ...] = ()


def _defs(max_input_length: int) -> dict[str, MetricDef]:
    length_buckets = tuple(float(2**i) for i in range(20) if 2**i <= max(1, max_input_length))
    items = [
        MetricDef("te_request_count", "counter", "API requests, by method (single or batch)"),
        MetricDef("te_request_success", "counter", "Successful API requests, by method"),
        MetricDef("te_request_failure", "counter", "Failed API requests, by error kind"),
        MetricDef("te_request_duration", "histogram", "Request duration (s)", _DURATION_BUCKETS),
        MetricDef(
            "te_request_tokenization_duration",
            "histogram",
            "Request tokenization duration (s, mean over inputs)",
            _DURATION_BUCKETS,
        ),
        MetricDef(
            "te_request_queue_duration",
            "histogram",
            "Request queue duration (s, mean over inputs)",
            _DURATION_BUCKETS,
        ),
        MetricDef(
            "te_request_inference_duration",
            "histogram",
            "Request inference duration (s, mean over inputs)",
            _DURATION_BUCKETS,
        ),
        MetricDef("te_embed_count", "counter", "Inputs entering the embed pipeline"),
        MetricDef("te_embed_success", "counter", "Inputs embedded successfully"),
        MetricDef(
            "te_embed_duration", "histogram", "Embed duration per input (s)", _DURATION_BUCKETS
        ),
        MetricDef(
            "te_embed_tokenization_duration",
            "histogram",
            "Embed tokenization duration per input (s)",
            _DURATION_BUCKETS,
        ),
        MetricDef(
            "te_embed_queue_duration",
            "histogram",
            "Embed queue duration per input (s)",
            _DURATION_BUCKETS,
        ),
        MetricDef(
            "te_embed_inference_duration",
            "histogram",
            "Embed inference duration per input (s)",
            _DURATION_BUCKETS,
        ),
        MetricDef("te_predict_count", "counter", "Inputs entering the predict pipeline"),
        MetricDef("te_predict_success", "counter", "Inputs predicted successfully"),
        MetricDef(
            "te_predict_duration", "histogram", "Predict duration per input (s)", _DURATION_BUCKETS
        ),
        MetricDef(
            "te_predict_tokenization_duration",
            "histogram",
            "Predict tokenization duration per input (s)",
            _DURATION_BUCKETS,
        ),
        MetricDef(
            "te_predict_queue_duration",
            "histogram",
            "Predict queue duration per input (s)",
            _DURATION_BUCKETS,
        ),
        MetricDef(
            "te_predict_inference_duration",
            "histogram",
            "Predict inference duration per input (s)",
            _DURATION_BUCKETS,
        ),
        MetricDef(
            "te_request_input_length", "histogram", "Tokens per encoded input", length_buckets
        ),
        MetricDef(
            "te_batch_next_size",
            "histogram",
            "Inputs per formed batch",
            tuple(float(2**i) for i in range(13)),
        ),
        MetricDef(
            "te_batch_next_tokens",
            "histogram",
            "Tokens per formed batch",
            tuple(float(2**i) for i in range(21)),
        ),
        MetricDef("te_queue_size", "gauge", "Entries waiting in the queue"),
    ]
    return {d.name: d for d in items}


Labels = tuple[tuple[str, str], ...]


@dataclass
class _Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        index = bisect.bisect_left(self.buckets, value)
        if index < len(self.counts):
            self.counts[index] += 1
        self.total += value
        self.count += 1


class Metrics:
    """A thread-safe registry; metrics appear in the output once first recorded, as in TEI."""

    def __init__(self, max_input_length: int = 512) -> None:
        self.defs = _defs(max_input_length)
        self._lock = threading.Lock()
        self._values: dict[str, dict[Labels, float]] = {}
        self._histograms: dict[str, dict[Labels, _Histogram]] = {}

    def define(self, metric: MetricDef) -> None:
        """Add a metric beyond TEI's set."""
        self.defs[metric.name] = metric

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._values.setdefault(name, {})
            series[key] = series.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values.setdefault(name, {})[key] = value

    def observe(self, name: str, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._histograms.setdefault(name, {})
            hist = series.get(key)
            if hist is None:
                hist = series[key] = _Histogram(self.defs[name].buckets)
            hist.observe(value)

    def value(self, name: str, **labels: str) -> float:
        """The current value of a counter or gauge series (0 when never recorded)."""
        key = tuple(sorted(labels.items()))
        with self._lock:
            return self._values.get(name, {}).get(key, 0.0)

    def render(self) -> str:
        """Prometheus text exposition format 0.0.4."""
        lines: list[str] = []
        with self._lock:
            for name in sorted(set(self._values) | set(self._histograms)):
                metric = self.defs[name]
                lines.append(f"# HELP {name} {metric.help}")
                lines.append(f"# TYPE {name} {metric.kind}")
                if metric.kind == "histogram":
                    for labels, hist in sorted(self._histograms.get(name, {}).items()):
                        cumulative = 0
                        for bound, count in zip(hist.buckets, hist.counts, strict=False):
                            cumulative += count
                            le = (("le", _fmt(bound)),)
                            lines.append(f"{name}_bucket{_labels(labels + le)} {cumulative}")
                        lines.append(
                            f"{name}_bucket{_labels((*labels, ('le', '+Inf')))} {hist.count}"
                        )
                        lines.append(f"{name}_sum{_labels(labels)} {_fmt(hist.total)}")
                        lines.append(f"{name}_count{_labels(labels)} {hist.count}")
                else:
                    for labels, value in sorted(self._values.get(name, {}).items()):
                        lines.append(f"{name}{_labels(labels)} {_fmt(value)}")
        return "\n".join(lines) + ("\n" if lines else "")


def _fmt(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(
        f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for k, v in labels
    )
    return "{" + inner + "}"
