"""Prometheus metrics with TEI's names, types, labels and buckets, defined once.

TEI renders counters without the `_total` suffix that prometheus_client would add, and Grafana
dashboards built for TEI query those exact names, so this module keeps its own small registry
and writes the text exposition format itself.

Unlike TEI, every unlabelled metric (and every known label value) is exported from the start
with zero values: a dashboard's `rate()` needs a first sample, and TEI's empty /metrics before
the first request is a standing complaint of its users (issue #520).

Several models share one registry and one page: every series carries a `model` label (with one
model too), and TEI's names, types and buckets are otherwise unchanged.

Beyond TEI, a few `vectorpress_*` metrics say where the time and the compute go: padding
efficiency of each batch, tokens per second per model, truncated and dropped inputs, and an
info metric whose labels name the backend, dtype and device.
"""

from __future__ import annotations

import bisect
import functools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from vectorpress.types import Batch

log = logging.getLogger(__name__)


def _duration_buckets() -> tuple[float, ...]:
    # The same float sequence as TEI's router (start at 1e-5, multiply by 1.5 before each
    # push), so `le` labels match TEI's to the last digit.
    out = []
    value = 0.00001
    for _ in range(35):
        value *= 1.5
        out.append(value)
    return tuple(out)


_DURATION_BUCKETS = _duration_buckets()
_EFFICIENCY_BUCKETS = tuple(i / 20 for i in range(1, 21))

#: Label values exported at zero from the start.
REQUEST_METHODS = ("single", "batch")
FAILURE_KINDS = (
    "batch_size",
    "validation",
    "tokenization",
    "overloaded",
    "model_type",
    "inference",
    "dropped",
)

#: How far back `vectorpress_tokens_per_second` looks.
THROUGHPUT_WINDOW_S = 10.0


@dataclass(frozen=True)
class MetricDef:
    name: str
    kind: str  # counter, gauge or histogram
    help: str
    buckets: tuple[float, ...] = ()


@functools.cache
def stage_histograms(prefix: str) -> tuple[str, str, str, str]:
    """The names of TEI's four timing histograms of a stage family (`te_request`, `te_embed`,
    `te_predict`): total, tokenization, queue and inference duration."""
    return (
        f"{prefix}_duration",
        f"{prefix}_tokenization_duration",
        f"{prefix}_queue_duration",
        f"{prefix}_inference_duration",
    )


def _stage_defs(prefix: str, per: str) -> list[MetricDef]:
    what = ("Total", "Tokenization", "Queue", "Inference")
    return [
        MetricDef(name, "histogram", f"{label} duration {per} (s)", _DURATION_BUCKETS)
        for name, label in zip(stage_histograms(prefix), what, strict=True)
    ]


def tei_defs(max_input_length: int) -> dict[str, MetricDef]:
    """TEI's metrics (spec section 4), with its buckets."""
    length_buckets = tuple(float(2**i) for i in range(20) if 2**i <= max(1, max_input_length))
    items = [
        MetricDef("te_request_count", "counter", "API requests, by method (single or batch)"),
        MetricDef("te_request_success", "counter", "Successful API requests, by method"),
        MetricDef("te_request_failure", "counter", "Failed API requests, by error kind"),
        *_stage_defs("te_request", "per request (mean over inputs)"),
        MetricDef("te_embed_count", "counter", "Inputs entering the embed pipeline"),
        MetricDef("te_embed_success", "counter", "Inputs embedded successfully"),
        *_stage_defs("te_embed", "per embed input"),
        MetricDef("te_predict_count", "counter", "Inputs entering the predict pipeline"),
        MetricDef("te_predict_success", "counter", "Inputs predicted successfully"),
        *_stage_defs("te_predict", "per predict input"),
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


def extra_defs() -> dict[str, MetricDef]:
    """What vectorpress reports beyond TEI."""
    items = [
        MetricDef(
            "vectorpress_info",
            "gauge",
            "Always 1; the labels name the served model, backend, dtype and device",
        ),
        MetricDef(
            "vectorpress_batch_padding_efficiency",
            "histogram",
            "Real tokens / computed tokens per batch (1.0 for packed backends)",
            _EFFICIENCY_BUCKETS,
        ),
        MetricDef("vectorpress_batch_real_tokens", "counter", "Real tokens of all batches run"),
        MetricDef(
            "vectorpress_batch_computed_tokens",
            "counter",
            "Tokens computed for all batches run, padding included",
        ),
        MetricDef("vectorpress_tokens", "counter", "Tokens run through the model, by model"),
        MetricDef(
            "vectorpress_tokens_per_second",
            "gauge",
            f"Tokens run through the model per second over the last {THROUGHPUT_WINDOW_S:g} s",
        ),
        MetricDef("vectorpress_batch_failures", "counter", "Batches whose forward pass failed"),
        MetricDef(
            "vectorpress_backend_busy_seconds",
            "counter",
            "Seconds the backend spent in successful forward passes (its rate is utilisation)",
        ),
        MetricDef(
            "vectorpress_truncated_inputs", "counter", "Inputs cut to the model's input limit"
        ),
        MetricDef(
            "vectorpress_dropped_inputs",
            "counter",
            "Inputs dropped from the queue because their caller had gone",
        ),
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


#: Records waiting to be folded into the series past which the request that ends next folds
#: them (`Registry.fold_due`), and past which any record folds them at once (a bound for code
#: that never calls `fold_due`).
FOLD_AT = 256
PENDING_MAX = 8192

#: Label sets a model keeps built (`Metrics._key`); past it they are built on each call.
MAX_KEYS = 256

#: A histogram's bounds by its name; KeyError for a name nothing defines (`Registry._fold`
#: then drops that name's values).
Buckets = Callable[[str], tuple[float, ...]]
_NONE: dict[Labels, _Histogram] = {}
_Record = tuple[Labels, tuple[tuple[str, float], ...], Buckets | None]


class Registry:
    """The process's one set of series (every model's), thread-safe, rendered as Prometheus
    text. Models record into it through their own `Metrics` view.

    Increments and observations wait in a queue and are folded into the series in batches:
    when a request that has ended finds `FOLD_AT` of them waiting (`fold_due`), and before
    anything reads a series (a scrape, `value`), so readers see every record made before they
    read. The event loop records a one-text /embed's twenty values in nine calls, with the
    caches cold from its forward pass: applied as they came they took 96-103 us a request by
    means (`bench/short_query.py metrics`, each request after a read as large as
    all-MiniLM-L6-v2's linear weights), queued 58-65 (p50 45-51 against 93-102), the fold
    of about 17 requests' records included, which walks the series once with its caches warm.
    Folding every 64 records instead: 68.
    """

    def __init__(self) -> None:
        self.defs: dict[str, MetricDef] = {}
        self._lock = threading.Lock()
        self._values: dict[str, dict[Labels, float]] = {}
        self._histograms: dict[str, dict[Labels, _Histogram]] = {}
        self._gauges: dict[str, dict[Labels, Callable[[], float]]] = {}
        # deque: appends and pops from any thread without the lock, none lost to a fold.
        self._pending: deque[_Record] = deque()
        self._undefined: set[str] = set()

    def define(self, metric: MetricDef) -> None:
        self.defs.setdefault(metric.name, metric)

    def gauge_callback(self, name: str, key: Labels, read: Callable[[], float]) -> None:
        with self._lock:
            self._gauges.setdefault(name, {})[key] = read

    def start(self, name: str, key: Labels, buckets: tuple[float, ...] | None = None) -> None:
        """Export a series at zero before anything is recorded in it."""
        with self._lock:
            if buckets is None:
                self._values.setdefault(name, {}).setdefault(key, 0.0)
            else:
                self._histograms.setdefault(name, {}).setdefault(key, _Histogram(buckets))

    def inc_many(self, key: Labels, values: Iterable[tuple[str, float]]) -> None:
        """Increments of several counters of one label set (queued, folded later)."""
        self._pending.append((key, tuple(values), None))
        if len(self._pending) >= PENDING_MAX:
            self.fold()

    def set(self, name: str, key: Labels, value: float) -> None:
        with self._lock:
            self._fold()
            self._values.setdefault(name, {})[key] = value

    def observe_many(
        self, key: Labels, values: Iterable[tuple[str, float]], buckets: Buckets
    ) -> None:
        """`observe` into several histograms of one label set (folded later); `buckets`
        gives a histogram's bounds by name where it does not exist yet."""
        self._pending.append((key, tuple(values), buckets))
        if len(self._pending) >= PENDING_MAX:
            self.fold()

    def fold_due(self) -> None:
        """Fold the waiting records if there are `FOLD_AT` of them: called as a request ends,
        after its answer has been written."""
        if len(self._pending) >= FOLD_AT:
            self.fold()

    def fold(self) -> None:
        with self._lock:
            self._fold()

    def _fold(self) -> None:
        """Apply the records waiting now (lock held); those appended meanwhile wait for the
        next fold."""
        pending, values, histograms = self._pending, self._values, self._histograms
        for _ in range(len(pending)):
            key, records, buckets = pending.popleft()
            if buckets is None:
                for name, value in records:
                    series = values.setdefault(name, {})
                    series[key] = series.get(key, 0.0) + value
                continue
            for name, value in records:
                hist = histograms.get(name, _NONE).get(key)
                if hist is None:
                    hist = self._new_histogram(name, key, buckets)
                    if hist is None:
                        continue
                hist.observe(value)

    def _new_histogram(self, name: str, key: Labels, buckets: Buckets) -> _Histogram | None:
        """A histogram series made at its first value (lock held). A name nothing defines has
        no bounds: its values are dropped and said once, so that a fold, run by whichever
        request or scrape comes next, never fails on another's record."""
        try:
            bounds = buckets(name)
        except KeyError:
            if name not in self._undefined:
                self._undefined.add(name)
                log.error("no histogram is defined as %r: its values are dropped", name)
            return None
        hist = _Histogram(bounds)
        self._histograms.setdefault(name, {})[key] = hist
        return hist

    def value(self, name: str, key: Labels) -> float:
        read = self._gauges.get(name, {}).get(key)
        if read is not None:
            return float(read())
        with self._lock:
            self._fold()
            return self._values.get(name, {}).get(key, 0.0)

    def render(self, model: str | None = None) -> str:
        """Prometheus text exposition format 0.0.4: every series, or with `model` that
        model's and the server-wide ones (those without a `model` label)."""
        # Read outside the lock: a callback may take it (tokens per second does).
        gauges = {
            name: {key: float(read()) for key, read in series.items()}
            for name, series in list(self._gauges.items())
        }
        lines: list[str] = []
        with self._lock:
            self._fold()
            for name, series in gauges.items():
                self._values.setdefault(name, {}).update(series)
            for name in sorted(set(self._values) | set(self._histograms)):
                metric = self.defs[name]
                lines.append(f"# HELP {name} {metric.help}")
                lines.append(f"# TYPE {name} {metric.kind}")
                if metric.kind == "histogram":
                    for labels, hist in sorted(self._histograms.get(name, {}).items()):
                        if not _belongs(labels, model):
                            continue
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
                        if _belongs(labels, model):
                            lines.append(f"{name}{_labels(labels)} {_fmt(value)}")
        return "\n".join(lines) + ("\n" if lines else "")


class Metrics:
    """One model's view of the registry: every series it records carries `model=<name>`, so
    one page holds every model's and TEI's dashboards, which filter on names, keep working."""

    def __init__(
        self, max_input_length: int = 512, model: str = "", registry: Registry | None = None
    ) -> None:
        self.defs = {**tei_defs(max_input_length), **extra_defs()}
        self.model = model
        self.registry = registry if registry is not None else Registry()
        self._base: Labels = (("model", model),)
        self._keys: dict[tuple[str, str], Labels] = {}
        self._lock = threading.Lock()
        self._recent: deque[tuple[float, int]] = deque()
        self._initialise()

    def _key(self, labels: dict[str, str]) -> Labels:
        # Most calls carry no other label; skip the sort for them (this runs several times
        # per input). A request's own label (its method, its failure) comes from a small set:
        # its key is built once.
        if not labels:
            return self._base
        if len(labels) == 1:
            ((label, value),) = labels.items()
            key = self._keys.get((label, value))
            if key is None:
                key = tuple(sorted({label: value, "model": self.model}.items()))
                if len(self._keys) < MAX_KEYS:
                    self._keys[(label, value)] = key
            return key
        return tuple(sorted({**labels, "model": self.model}.items()))

    def _initialise(self) -> None:
        for metric in self.defs.values():
            self.registry.define(metric)
            if metric.kind == "histogram":
                self.registry.start(metric.name, self._base, metric.buckets)
            elif metric.name not in ("vectorpress_info", *_LABELLED):
                self.registry.start(metric.name, self._base)
        for name in ("te_request_count", "te_request_success"):
            for m in REQUEST_METHODS:
                self.registry.start(name, self._key({"method": m}))
        for e in FAILURE_KINDS:
            self.registry.start("te_request_failure", self._key({"err": e}))
        self.gauge_callback("vectorpress_tokens_per_second", self._tokens_per_second)

    def define(self, metric: MetricDef) -> None:
        """Add a metric beyond the built-in set."""
        self.defs[metric.name] = metric
        self.registry.define(metric)

    def gauge_callback(self, name: str, read: Callable[[], float], **labels: str) -> None:
        """Read this gauge (one series) at scrape time instead of storing it."""
        self.registry.gauge_callback(name, self._key(labels), read)

    def set_info(self, **labels: str) -> None:
        self.set("vectorpress_info", 1.0, **labels)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        self.registry.inc_many(self._key(labels), ((name, value),))

    def set(self, name: str, value: float, **labels: str) -> None:
        self.registry.set(name, self._key(labels), value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        self.registry.observe_many(self._key(labels), ((name, value),), self._buckets)

    def observe_many(self, values: Iterable[tuple[str, float]]) -> None:
        """Observations of this model's unlabelled histograms, in one call: a request records
        a dozen after its answer, on the event loop, with the caches cold from its pass, where
        `observe` makes four Python calls for each."""
        self.registry.observe_many(self._base, values, self._buckets)

    def _buckets(self, name: str) -> tuple[float, ...]:
        return self.defs[name].buckets

    def inc_many(self, values: Iterable[tuple[str, float]]) -> None:
        """Increments of this model's unlabelled counters, in one call."""
        self.registry.inc_many(self._base, values)

    def fold_due(self) -> None:
        """A request has ended: fold the registry's waiting records if enough wait."""
        self.registry.fold_due()

    def value(self, name: str, **labels: str) -> float:
        """The current value of one of this model's counter or gauge series (0 when never
        recorded)."""
        return self.registry.value(name, self._key(labels))

    def render(self) -> str:
        """The whole registry's page (every model's series)."""
        return self.registry.render()

    # -- what the pipeline reports -------------------------------------------------------------

    def record_batch(self, batch: Batch, elapsed: float, padded: bool, ok: bool) -> None:
        """One formed batch: TEI's size and token histograms, then the extras.

        Health checks' inputs are left out: a batch of nothing else is not recorded at all.
        """
        size = batch.size - batch.probes
        if size == 0:
            return
        tokens = batch.total_tokens - batch.probe_tokens
        observed: list[tuple[str, float]] = [
            ("te_batch_next_size", size),
            ("te_batch_next_tokens", tokens),
        ]
        if not ok:
            self.observe_many(observed)
            self.inc("vectorpress_batch_failures")
            return
        computed = batch.max_seqlen * size if padded else tokens
        observed.append(
            ("vectorpress_batch_padding_efficiency", tokens / computed if computed else 1.0)
        )
        self.observe_many(observed)
        self.inc_many(
            (
                ("vectorpress_batch_real_tokens", tokens),
                ("vectorpress_batch_computed_tokens", computed),
                ("vectorpress_tokens", tokens),
                ("vectorpress_backend_busy_seconds", elapsed),
            )
        )
        now = time.monotonic()
        with self._lock:
            self._recent.append((now, tokens))
            self._prune(now)  # here too, or a server nobody scrapes would grow without end

    def _prune(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - THROUGHPUT_WINDOW_S:
            self._recent.popleft()

    def _tokens_per_second(self) -> float:
        now = time.monotonic()
        with self._lock:
            self._prune(now)
            total = sum(n for _, n in self._recent)
        return total / THROUGHPUT_WINDOW_S


#: Series that only exist with their own labels; nothing is exported for them unlabelled.
_LABELLED = ("te_request_count", "te_request_success", "te_request_failure")


#: The content type of `render()`'s output.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _belongs(labels: Labels, model: str | None) -> bool:
    """Whether a series is on the page of `model` (None: the whole page)."""
    if model is None:
        return True
    named = dict(labels).get("model")
    return named is None or named == model


def _fmt(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    text = repr(float(value))
    if "e" not in text:
        return text
    # Positional notation, as TEI's exporter writes bucket bounds (1.5e-05 -> 0.000015).
    mantissa, exp = text.split("e")
    digits = mantissa.replace("-", "").replace(".", "")
    point = mantissa.lstrip("-").find(".") if "." in mantissa else len(mantissa.lstrip("-"))
    point += int(exp)
    sign = "-" if value < 0 else ""
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
