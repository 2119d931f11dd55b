"""bench/run.py's report: the targets table, a table per model, the JSON, the plot, the history.

Every share is of a ceiling measured in the same run on the model's own GEMM shape: fp32 methods
against the fp32 GEMM, bf16 methods against the bf16 GEMM, int8 methods against the fp32 one
(int8 has no ceiling of its own here; its target is a multiple of bf16).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.breakdown import INT8_PEAK_OVER_BF16, int8_bound

NAN = float("nan")


@dataclass
class Result:
    name: str
    load: dict[str, dict[str, float]] = field(default_factory=dict)
    """load name -> tokens_per_s (pairs_per_s for rerank), p50_ms, p99_ms, errors, wall_s and,
    for vectorpress, device_idle (the share of the load's wall time its device thread did not
    spend on batches)"""
    short_p50_ms: float = NAN
    short_p99_ms: float = NAN
    overhead_ms: float = NAN
    """vectorpress only: p50 over short queries of each one's HTTP time minus the inference
    time the server recorded for it (te_request_inference_duration)."""
    cos_min: float = NAN
    cos_mean: float = NAN
    """Lowest and mean cosine to sentence-transformers' fp32 vectors over every corpus text."""
    score_diff: float = NAN
    """Rerank: the largest difference to CrossEncoder.predict's score of the same pair."""
    note: str = ""
    gflops: dict[str, float] = field(default_factory=dict)
    """dtype ("fp32", "bf16") -> the GEMM ceiling measured just before and just after this
    method's loads, the higher of the two (`run.ceiling_around`): its shares are of this one
    (`own_ceiling`), so that a machine whose speed drifts during a half-hour run leaves the
    shares level."""

    @staticmethod
    def median(rounds: list[Result]) -> Result:
        """One method's figures over several rounds: the median of each, the lowest cosine
        (rounds that failed are left out; with none left, the last failure)."""
        ok = [r for r in rounds if r.load]
        if len(ok) < 2:
            return ok[0] if ok else rounds[-1]
        out = Result(ok[0].name, note=ok[0].note)
        for key, figures in ok[0].load.items():
            out.load[key] = {
                m: statistics.median(r.load[key][m] for r in ok if m in r.load.get(key, {}))
                for m in figures
            }
        for name in ("short_p50_ms", "short_p99_ms", "overhead_ms", "cos_mean"):
            setattr(out, name, statistics.median(getattr(r, name) for r in ok))
        out.cos_min = min(r.cos_min for r in ok)
        out.gflops = {
            d: statistics.median(r.gflops[d] for r in ok if d in r.gflops) for d in ok[0].gflops
        }
        out.score_diff = max(r.score_diff for r in ok)
        if len(ok) < len(rounds):
            out.note = f"{len(rounds) - len(ok)} of {len(rounds)} rounds failed"
        return out


@dataclass
class Suite:
    """One embedding model's part of the run."""

    label: str
    folder: Path
    texts: list[str]
    counts: list[int]
    sweep: list[int]
    ceiling: dict[str, Any]
    results: list[Result] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "model": self.label,
            "texts": len(self.texts),
            "tokens": sum(self.counts),
            "sweep": self.sweep,
            "ceiling": self.ceiling,
            "results": [asdict(r) for r in self.results],
        }


# ---------------------------------------------------------------- figures


def tokens_ceiling(ceiling: dict[str, Any], dtype: str) -> float:
    """Tokens/s the GEMM ceiling of `dtype` ("fp32", "bf16") allows; nan without one."""
    gflops = ceiling.get(f"{dtype}_gflops")
    return gflops * 1e9 / ceiling["flops_per_token"] if gflops else NAN


def own_ceiling(ceiling: dict[str, Any], r: dict[str, Any] | Result | None) -> dict[str, Any]:
    """`ceiling` with the GEMM figures measured around `r`'s own loads, where the run took them
    (runs before these figures have none: the run's one ceiling then)."""
    measured = (r.gflops if isinstance(r, Result) else (r or {}).get("gflops")) or {}
    return {**ceiling, **{f"{d}_gflops": v for d, v in measured.items() if v}}


def own_dtype(name: str) -> str:
    return "bf16" if "bf16" in name else "fp32"


def figure(r: dict[str, Any] | Result | None, load: str, what: str = "tokens_per_s") -> float:
    if r is None:
        return NAN
    loads = r.load if isinstance(r, Result) else r.get("load") or {}
    return float(loads.get(load, {}).get(what, NAN))


def find(results: list[Result], name: str) -> Result | None:
    return next((r for r in results if r.name == name and r.load), None)


def load_shares(
    ceiling: dict[str, Any], r: Result | None, dtype: str, loads: tuple[str, ...]
) -> list[float]:
    """`r`'s figure on each of `loads` as a share of its own `dtype` ceiling (`own_ceiling`)."""
    limit = tokens_ceiling(own_ceiling(ceiling, r), dtype)
    return [figure(r, k) / limit for k in loads]


def fastest(
    results: list[Result], dtype: str, loads: tuple[str, ...], ceiling: dict[str, Any]
) -> Result | None:
    """The vectorpress backend of `dtype` ("fp32" or "bf16"; int8 rows are judged apart) with the
    highest share of its own ceiling on its weaker load, then on its other: the targets ask for
    the path a user can choose, and the table names it. Shares, not tokens/s: each method's
    ceiling is measured around its own loads, and a tie on the weaker load is settled by the
    other (79% / 72% over 72% / 72%)."""
    found = [
        r
        for r in results
        if r.name.startswith("vectorpress") and r.load and "int8" not in r.name
        if own_dtype(r.name) == dtype
    ]

    def ranked(r: Result) -> list[float]:
        return sorted(v if v == v else -math.inf for v in load_shares(ceiling, r, dtype, loads))

    return max(found, key=ranked, default=None)


def fmt(v: float, spec: str = ",.0f", suffix: str = "") -> str:
    return "-" if v != v else format(v, spec) + suffix


def pair(a: float, b: float, spec: str = ",.0f", suffix: str = "") -> str:
    return f"{fmt(a, spec, suffix)} / {fmt(b, spec, suffix)}"


def verdict(met: bool | None) -> str:
    return "n/a" if met is None else "**met**" if met else "not met"


def at_least(values: list[float], bound: float) -> bool | None:
    if any(v != v for v in values):
        return None
    return all(v >= bound for v in values)


def at_most(value: float, bound: float) -> bool | None:
    return None if value != value else value <= bound


# ---------------------------------------------------------------- targets


def targets(
    suites: list[Suite],
    rerank: dict[str, Any] | None,
    profile: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Issue 26's targets as rows: what, the figure, the target, met (None: not measured);
    `profile` (bench/breakdown.py's passes) adds the most int8 can reach over its rival here."""
    rows: list[dict[str, Any]] = []

    def row(what: str, shown: str, target: str, met: bool | None) -> None:
        rows.append({"what": what, "figure": shown, "target": target, "met": met})

    main = suites[0]
    top = f"1x{max(main.sweep)}"
    loads = ("32x4", top)
    fp32 = fastest(main.results, "fp32", loads, main.ceiling)
    bf16 = fastest(main.results, "bf16", loads, main.ceiling)
    quickest = min(
        (r for r in main.results if r.name.startswith("vectorpress") and own_dtype(r.name) == "fp32"
         and "int8" not in r.name and r.short_p50_ms == r.short_p50_ms),
        key=lambda r: r.short_p50_ms, default=None,
    )  # fmt: skip

    def named(r: Result | None) -> str:
        return f" [{r.name}]" if r else ""

    def shares(suite: Suite, r: Result | None, dtype: str) -> list[float]:
        return load_shares(suite.ceiling, r, dtype, ("32x4", f"1x{max(suite.sweep)}"))

    s = shares(main, fp32, "fp32")
    row(f"fp32 over HTTP, share of the fp32 ceiling (32x4 / {top}){named(fp32)}", pair(*s, ".0%"),
        ">= 75% on both", at_least(s, 0.75))  # fmt: skip
    s = shares(main, bf16, "bf16")
    row(f"bf16 over HTTP, share of the bf16 ceiling (32x4 / {top}){named(bf16)}", pair(*s, ".0%"),
        ">= 65% on both", at_least(s, 0.65))  # fmt: skip
    cos = bf16.cos_min if bf16 else NAN
    row("bf16 lowest cosine to fp32 over every corpus text (mean)",
        f"{fmt(cos, '.5f')} ({fmt(bf16.cos_mean if bf16 else NAN, '.5f')})", ">= 0.999",
        at_least([cos], 0.999))  # fmt: skip

    int8 = [r for r in main.results if "int8" in r.name and r.load]
    # A CPU without native bf16 serves no bf16 path (OpenVINO refuses it, torch's is emulated):
    # int8's rival there is the fastest float path it has, fp32.
    base, base_name = (bf16, "bf16") if bf16 else (fp32, "fp32 (this CPU has no native bf16)")
    if int8 and base:
        ratios = {r.name: [figure(r, k) / figure(base, k) for k in loads] for r in int8}
        accurate = [r for r in int8 if r.cos_min >= 0.99]
        best = max(accurate or int8, key=lambda r: min(ratios[r.name]))
        met = at_least(ratios[best.name], 1.3)
        row(f"int8 (the best: {best.name}) / {base_name} throughput (32x4 / {top})",
            pair(*ratios[best.name], ".2f", "x"), ">= 1.3x on both at cosine >= 0.99",
            None if met is None else met and best.cos_min >= 0.99)  # fmt: skip
        row(f"{best.name}: lowest cosine to fp32 (mean)",
            f"{fmt(best.cos_min, '.5f')} ({fmt(best.cos_mean, '.5f')})", ">= 0.99",
            at_least([best.cos_min], 0.99))  # fmt: skip
    else:
        row("int8 / bf16 throughput", "-", ">= 1.3x at cosine >= 0.99", None)
    rival = next(
        (p for p in profile or [] if p["dtype"] == "bfloat16" and p["gemm"] is not None), None
    )
    if rival is not None:
        bound = int8_bound(rival["gemm"])
        row(f"the most int8 can reach over bf16 here: its GEMMs at most {INT8_PEAK_OVER_BF16:g}x "
            f"bf16's, {rival['gemm']:.0%} of the bf16 pass (in-process profile, below)",
            f"{bound:.2f}x", ">= 1.3x", bound >= 1.3)  # fmt: skip
    p50 = quickest.short_p50_ms if quickest else NAN
    row(f"one short query over HTTP, fp32, p50{named(quickest)}", fmt(p50, ".2f", " ms"),
        "<= 3.0 ms", at_most(p50, 3.0))  # fmt: skip
    over = quickest.overhead_ms if quickest else NAN
    row("server overhead on it (HTTP mean - the server's mean inference time, the same queries)",
        fmt(over, ".2f", " ms"),
        "<= 0.5 ms", at_most(over, 0.5))  # fmt: skip
    infinity = [r for r in main.results if r.name.startswith("Infinity") and r.load]
    if infinity:
        vs = [figure(fp32, k) / max(figure(r, k) for r in infinity) for k in loads]
        row(f"fp32 x Infinity's faster engine (32x4 / {top})", pair(*vs, ".2f", "x"),
            ">= 4x on both", at_least(vs, 4.0))  # fmt: skip
    else:
        row("fp32 x Infinity's faster engine", "-", ">= 4x on both loads", None)

    for suite in suites[1:]:
        stop = f"1x{max(suite.sweep)}"
        for dtype, bound in (("fp32", 0.75), ("bf16", 0.65)):
            r = fastest(suite.results, dtype, ("32x4", stop), suite.ceiling)
            s = shares(suite, r, dtype)
            row(f"{suite.label} {dtype}, share of its {dtype} ceiling (32x4 / {stop}){named(r)}",
                pair(*s, ".0%"), f">= {bound:.0%} on both", at_least(s, bound))  # fmt: skip
        r = fastest(suite.results, "bf16", ("32x4", stop), suite.ceiling)
        cos = r.cos_min if r else NAN
        row(f"{suite.label} bf16 lowest cosine to fp32 (mean){named(r)}",
            f"{fmt(cos, '.5f')} ({fmt(r.cos_mean if r else NAN, '.5f')})", ">= 0.999",
            at_least([cos], 0.999))  # fmt: skip

    if rerank:
        results = rerank["results"]
        ce = next((r for r in results if r.name.startswith("sentence-transformers")), None)
        vp = find(results, "vectorpress fp32")
        ce_rate = figure(ce, "20x1", "pairs_per_s")
        x = [figure(vp, k, "pairs_per_s") / ce_rate for k in ("20x1", "20x4")]
        row("rerank fp32 pairs/s x CrossEncoder.predict (1 / 4 in flight)",
            pair(*x, ".2f", "x"), "> 1x (the issue names no multiple)",
            at_least(x, 1.0))  # fmt: skip
        for dtype, bound in (("fp32", 0.75), ("bf16", 0.65)):
            r = find(results, f"vectorpress {dtype}")
            limit = rerank_ceiling(own_ceiling(rerank["ceiling"], r), dtype)
            s = figure(r, "20x4", "pairs_per_s") / limit
            row(f"rerank {dtype}, share of the {dtype} rerank ceiling (4 in flight)",
                fmt(s, ".0%"), f">= {bound:.0%} (the embedding target)",
                at_least([s], bound))  # fmt: skip
    return rows


def rerank_ceiling(ceiling: dict[str, Any], dtype: str) -> float:
    """Pairs/s the GEMM ceiling allows on the load's pairs (attention at their token-weighted
    mean length)."""
    return tokens_ceiling(ceiling, dtype) / ceiling["tokens_per_pair"]


# ---------------------------------------------------------------- tables


def embedding_table(suite: Suite) -> list[str]:
    results = suite.results
    st = next(r for r in results if r.name.startswith("sentence-transformers"))
    st_tps = figure(st, "encode32")
    infinity = [r for r in results if r.name.startswith("Infinity") and r.load]
    top = f"1x{max(suite.sweep)}"
    c, fpt = suite.ceiling, suite.ceiling["flops_per_token"]

    def best_inf(load: str) -> float:
        return max((figure(r, load) for r in infinity), default=NAN)

    lines = [
        f"## {suite.label}",
        "",
        f"Corpus of {len(suite.texts)} texts, {sum(suite.counts):,} tokens. Ceiling on its FFN "
        f"GEMM ({c['gemm_shape']}): fp32 {c['fp32_gflops']:.0f} GFLOP/s = "
        f"{tokens_ceiling(c, 'fp32'):,.0f} tokens/s"
        + (
            f"; bf16 {c['bf16_gflops']:.0f} GFLOP/s = {tokens_ceiling(c, 'bf16'):,.0f} tokens/s"
            if c["bf16_gflops"]
            else "; bf16: this CPU has no native bf16 GEMM"
        )
        + f" ({fpt / 1e6:.2f} MFLOP per token, attention over {c.get('attended_keys', NAN):.0f} "
        "keys: the token-weighted mean text length)." + drift(results),
        "",
        f"| method | 32-text x 4 tok/s | 1-text x {top[2:]} tok/s | x ST (32x4 / {top}) | "
        f"x best Infinity (32x4 / {top}) | of its ceiling (32x4 / {top}) | lowest / mean cos "
        f"to fp32 | device idle (32x4 / {top}) | short query p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cos = f"{fmt(r.cos_min, '.4f')} / {fmt(r.cos_mean, '.4f')}"
        if r is st:
            lines.append(
                f"| {r.name} | {fmt(st_tps)} (encode) | - | 1.00 | "
                f"{fmt(st_tps / best_inf('32x4'), '.2f')} / - | "
                f"{fmt(st_tps / tokens_ceiling(own_ceiling(c, r), 'fp32'), '.0%')} | "
                "(reference) | - | "
                f"{pair(r.short_p50_ms, r.short_p99_ms, '.1f')} |"
            )
            continue
        if not r.load:
            lines.append(f"| {r.name} | - | - | - | - | - | - | - | - ({r.note}) |")
            continue
        b, s = figure(r, "32x4"), figure(r, top)
        limit = tokens_ceiling(own_ceiling(c, r), own_dtype(r.name))
        idle = pair(figure(r, "32x4", "device_idle"), figure(r, top, "device_idle"), ".0%")
        lines.append(
            f"| {r.name} | {fmt(b)} | {fmt(s)} | {pair(b / st_tps, s / st_tps, '.2f')} | "
            f"{pair(b / best_inf('32x4'), s / best_inf(top), '.2f')} | "
            f"{pair(b / limit, s / limit, '.0%')} | {cos} | {idle} | "
            f"{pair(r.short_p50_ms, r.short_p99_ms, '.1f')} |"
        )
    overheads = [
        f"{r.name} {r.overhead_ms:.2f} ms" for r in results if not math.isnan(r.overhead_ms)
    ]
    if overheads:
        lines += [
            "",
            "Server overhead on the short query (its HTTP mean minus the server's mean "
            "inference time over the same queries, te_request_inference_duration; it includes "
            "the client's own work): " + "; ".join(overheads) + ".",
        ]
    notes = [f"- {r.name}: {r.note}" for r in results if r.note]
    return lines + (["", *notes] if notes else [])


def drift(results: list[Result]) -> str:
    """The range of the GEMM ceilings measured around each method's loads, as a sentence."""
    spans = []
    for dtype in ("fp32", "bf16"):
        seen = [r.gflops[dtype] for r in results if r.gflops.get(dtype)]
        if seen:
            spans.append(f"{dtype} {min(seen):.0f}-{max(seen):.0f}")
    if not spans:
        return ""
    return (
        " Measured again around each method's loads (its shares are of that figure): "
        + ", ".join(spans)
        + " GFLOP/s."
    )


def rerank_table(part: dict[str, Any]) -> list[str]:
    c = part["ceiling"]
    results: list[Result] = part["results"]
    ce = results[0]
    ce_rate = figure(ce, "20x1", "pairs_per_s")
    lines = [
        "## Rerank",
        "",
        f"{part['checkpoint']}; {part['queries']} queries x {part['per_query']} passages "
        f"({part['pairs']} pairs, {c['tokens_per_pair']:.0f} tokens per pair on average), one "
        f"`/rerank` request per query. Ceiling on its GEMM ({c['gemm_shape']}): fp32 "
        f"{rerank_ceiling(c, 'fp32'):,.0f} pairs/s"
        + (f", bf16 {rerank_ceiling(c, 'bf16'):,.0f} pairs/s" if c["bf16_gflops"] else "")
        + ". CrossEncoder.predict runs in-process, one call per query (batch_size=32)."
        + drift(results),
        "",
        "| method | pairs/s, 1 in flight | pairs/s, 4 in flight | x CrossEncoder (1 / 4) | "
        "of its ceiling (1 / 4) | largest score difference to CrossEncoder | "
        "device idle (1 / 4) | request p50 ms (1 / 4) |",
        "|---|---|---|---|---|---|---|---|",
        f"| {ce.name} | {fmt(ce_rate)} | - | 1.00 | "
        f"{fmt(ce_rate / rerank_ceiling(own_ceiling(c, ce), 'fp32'), '.0%')} | "
        "(reference) | - | - |",
    ]
    for r in results[1:]:
        if not r.load:
            lines.append(f"| {r.name} | - | - | - | - | - | - | - ({r.note}) |")
            continue
        one, four = figure(r, "20x1", "pairs_per_s"), figure(r, "20x4", "pairs_per_s")
        limit = rerank_ceiling(own_ceiling(c, r), own_dtype(r.name))
        lines.append(
            f"| {r.name} | {fmt(one)} | {fmt(four)} | {pair(one / ce_rate, four / ce_rate, '.2f')}"
            f" | {pair(one / limit, four / limit, '.0%')} | {fmt(r.score_diff, '.1e')} | "
            f"{pair(figure(r, '20x1', 'device_idle'), figure(r, '20x4', 'device_idle'), '.0%')}"
            f" | {pair(figure(r, '20x1', 'p50_ms'), figure(r, '20x4', 'p50_ms'), '.1f')} |"
        )
    return lines


def profile_lines(profile: list[dict[str, Any]], suite: Suite) -> list[str]:
    """The in-process pass profile (bench/breakdown.py) as a table and what it bounds."""
    if not profile:
        return []
    lines = [
        f"## Where the pass's time goes ({suite.label}, torch, in-process)",
        "",
        f"The first {profile[0]['tokens']:,} tokens' texts of the corpus in arrival-order batches "
        "of 32 (the 32-text load's batches without the server), the torch backend's `embed`; "
        "shares of the ops' self CPU time under torch's profiler; the GEMMs' rate is the linear "
        "layers' FLOPs over the time they took.",
        "",
        "| dtype | tok/s | of its ceiling | GEMMs | attention | other | GEMMs' rate, of the "
        "ceiling |",
        "|---|---|---|---|---|---|---|",
    ]

    def known(value: float | None) -> float:
        return NAN if value is None else value

    for p in profile:
        # int8 has no ceiling of its own in the run: its shares of one read "-"; a pass the
        # profiler did not see (on a compiled kernel) has no shares either.
        key = {"float32": "fp32", "bfloat16": "bf16"}.get(p["dtype"], "")
        gflops = suite.ceiling.get(f"{key}_gflops") or NAN
        limit = tokens_ceiling(suite.ceiling, key) if key else NAN
        rate = known(p["gemm_gflops"])
        split = " | ".join(fmt(known(p[k]), ".0%") for k in ("gemm", "attention", "other"))
        lines.append(
            f"| {p['dtype']} | {fmt(p['tokens_per_s'])} | {fmt(p['tokens_per_s'] / limit, '.0%')}"
            f" | {split} | {fmt(rate)} GFLOP/s, {fmt(rate / gflops, '.0%')} |"
        )
    rival = next((p for p in profile if p["dtype"] == "bfloat16"), None)
    if rival is not None and rival["gemm"] is not None:
        lines += [
            "",
            "A quantized pass through the model's modules speeds up the GEMMs only: at most "
            f"1 / ((1 - g) + g / {INT8_PEAK_OVER_BF16:g}) = "
            f"{int8_bound(rival['gemm']):.2f}x the bf16 pass, with g = {rival['gemm']:.0%} the "
            "bf16 pass's GEMM share and int8's dot products at their peak, twice bf16's per "
            "cycle (AMX-INT8 against AMX-BF16, AVX512-VNNI against AVX512-BF16).",
        ]
    int8 = next((p for p in profile if p["dtype"] == "int8"), None)
    if rival is not None and int8 is not None:
        ran = (
            f"The int8 pass itself ran {int8['tokens_per_s'] / rival['tokens_per_s']:.2f}x the "
            "bf16 pass here, in-process, where the servers' int8 / bf16 above is over HTTP."
        )
        if int8["gemm"] is None:
            how = (
                " It ran on the compiled int8 kernel (`int8_kernel.py`), one call a pass outside "
                "torch's ops, which its profiler does not see: no shares. Its GEMMs' outputs are "
                "finished as they leave the registers and no op calls sit between its layers, so "
                "it is not held to the bound above, which counts the GEMMs alone."
            )
        else:
            how = (
                " Its shares leave out the rows' scaling and the GEMMs' finish (scale, bias, "
                "GELU) on the compiled kernel, called outside torch's ops (its profiler does not "
                "see them); its GEMMs' rate counts int8 operations."
            )
        lines += ["", ran + how]
    return [*lines, ""]


#: The bf16 method whose corpus cosines stand beside `--dtype auto`'s check, by backend.
BF16_METHOD = {"torch": "vectorpress bf16", "openvino": "vectorpress openvino bf16"}


def auto_lines(checks: list[dict[str, Any]], suites: list[Suite]) -> list[str]:
    """`--dtype auto`'s start-up check for each model and backend, beside the lowest cosine
    this run's bf16 server of that backend reached over the corpus: the rule may keep float32
    where bf16 would have held, never the reverse."""
    if not checks:
        return []
    lines = [
        "## `--dtype auto`",
        "",
        "What the start-up check measures on the 38 calibration texts (lowest cosine of bf16 "
        "to fp32 over their tokens' last hidden states, bound 0.9995, and over their vectors, "
        "bound 0.999), what it picks, and the lowest cosine to fp32 this run's bf16 server of "
        "the same backend reached over every corpus text.",
        "",
        "| model | backend | calibration tokens / vectors | picks | bf16 corpus lowest cos | "
        "rule holds |",
        "|---|---|---|---|---|---|",
    ]
    by_label = {s.label: s for s in suites}
    for c in checks:
        suite = by_label.get(c["model"])
        found = find(suite.results, BF16_METHOD[c["backend"]]) if suite else None
        corpus = found.cos_min if found else math.nan
        if math.isnan(corpus):
            holds = "-"
        elif c["picks"] == "bfloat16":
            holds = "yes" if corpus >= 0.999 else "**no**"
        else:
            holds = "yes (float32)" if corpus < 0.999 else "yes (float32, bf16 held)"
        lines.append(
            f"| {c['model']} | {c['backend']} | {c['tokens']:.5f} / {c['vectors']:.5f} | "
            f"{c['picks']} | {'-' if math.isnan(corpus) else f'{corpus:.5f}'} | {holds} |"
        )
    return [*lines, ""]


def write_report(
    suites: list[Suite], rerank: dict[str, Any] | None, meta: dict[str, Any], out: Path
) -> str:
    """latest.md, .json and .png under `out`, and the run's rows appended to history.md."""
    goals = targets(suites, rerank, meta.get("profile"))
    lines = [
        f"# vectorpress benchmark, {meta['stamp']}",
        "",
        f"Machine: {meta['machine']}; {meta['minutes']:.1f} minutes. Corpus: 40% short queries, "
        "40% medium, 20% long passages, truncated at each model's max_seq_length. Client and "
        "servers share the machine's cores; the load comes from one kept-alive connection per "
        "request in flight (bench/client.py)."
        + (
            f" Every figure is the median of {meta['rounds']} rounds, one after another "
            "(the lowest cosine: the lowest of the rounds)."
            if meta.get("rounds", 1) > 1
            else ""
        ),
        "",
        "## Targets",
        "",
        "| what | figure | target | |",
        "|---|---|---|---|",
        *(f"| {g['what']} | {g['figure']} | {g['target']} | {verdict(g['met'])} |" for g in goals),
        "",
        "Shares are of the GEMM ceiling measured in this run on the model's own FFN shape, "
        "around each method's own loads (the higher of the GEMM timed just before and just after "
        "them: the machine's speed drifts during a run, and a reading slowed by other work "
        "would flatter the method). "
        "Cosines compare each server's vectors of every corpus text (from its widest one-text "
        "load) with sentence-transformers' fp32 vectors of the same texts. Device idle: the "
        "share of a load's wall time the server's device thread spent on no batch "
        "(1 - the growth of vectorpress_backend_busy_seconds over it).",
        "",
    ]
    for suite in suites:
        lines += [*embedding_table(suite), ""]
    if rerank:
        lines += [*rerank_table(rerank), ""]
    lines += profile_lines(meta.get("profile") or [], suites[0])
    lines += auto_lines(meta.get("auto") or [], suites)
    lines += [
        f"Bare forward pass of the short query ({suites[0].label}, torch fp32, in-process): "
        f"{meta['bare_forward_ms']:.2f} ms p50. Short-query latency: one request at a time on "
        "a kept-alive connection (bench/client.py's blocking client).",
        "",
        f"Rerun: `{meta['command']}`",
        "",
    ]
    text = "\n".join(lines)
    main = suites[0]
    data = {
        "meta": meta,
        "ceiling": main.ceiling,
        "results": [asdict(r) for r in main.results],
        "second": [s.summary() for s in suites[1:]],
        "rerank": (
            {**rerank, "results": [asdict(r) for r in rerank["results"]]} if rerank else None
        ),
        "targets": goals,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "latest.md").write_text(text)
    (out / "latest.json").write_text(json.dumps(data, indent=1))
    plot(main, out / "latest.png")
    append_history(data, out / "history.md")
    return text


# ---------------------------------------------------------------- history

HISTORY_HEADER = [
    "# Benchmark history",
    "",
    "One row per model, method and run of `bench/run.py` (newest last); `latest.md` has the",
    "newest run whole. Shares are of the GEMM ceilings measured in the same run on the model's",
    "own shape (its ceiling: bf16's for bf16 rows, fp32's for the others). Rerank rows give",
    "pairs/s with 4 and 1 requests of 20 pairs in flight. Rows from before the accuracy and",
    "idle columns have none. From run 20261201T192247Z on, the FLOPs per token count attention",
    "over the token-weighted mean text length (sum L^2 / sum L), earlier runs over the mean",
    "text length: 4% fewer FLOPs per token on all-MiniLM-L6-v2, 2% on all-mpnet-base-v2, so",
    "their shares read that much lower.",
    "",
    "| run | command | model | method | 32x4 tok/s | 1xN tok/s | of fp32 ceiling | "
    "of its ceiling | lowest / mean cos | device idle 32x4 / 1xN | short p50 ms |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]


def history_rows(data: dict[str, Any]) -> list[str]:
    """A run's rows of the history table, from its JSON report."""
    meta = data["meta"]
    head = f"| {meta['stamp']} | `{meta['command']}`"
    parts = [
        {"model": meta["model"], "ceiling": data["ceiling"], "results": data["results"]},
        *data.get("second", []),
    ]
    rows = []
    for part in parts:
        c = part["ceiling"]
        for r in part["results"]:
            load = r.get("load") or {}
            bulk_key = "32x4" if "32x4" in load else "encode32"
            bulk = figure(r, bulk_key)
            singles = [k for k in load if k.startswith("1x")]
            top = max(singles, key=lambda k: int(k[2:]), default="")
            single = figure(r, top) if top else NAN
            best = max(bulk, single) if single == single else bulk
            idle = pair(figure(r, "32x4", "device_idle"), figure(r, top, "device_idle"), ".0%")
            rows.append(
                f"{head} | {part['model']} | {r['name']} | {fmt(bulk)} | "
                f"{fmt(single)}{f' ({top})' if top else ''} | "
                f"{fmt(best / tokens_ceiling(own_ceiling(c, r), 'fp32'), '.0%')} | "
                f"{fmt(best / tokens_ceiling(own_ceiling(c, r), own_dtype(r['name'])), '.0%')} | "
                f"{fmt(r.get('cos_min', NAN), '.4f')} / {fmt(r.get('cos_mean', NAN), '.4f')} | "
                f"{idle} | {fmt(r.get('short_p50_ms', NAN), '.1f')} |"
            )
    rerank = data.get("rerank")
    if rerank:
        c = rerank["ceiling"]
        for r in rerank["results"]:
            four = figure(r, "20x4", "pairs_per_s")
            one = figure(r, "20x1", "pairs_per_s")
            best = four if four == four else one
            idle = pair(figure(r, "20x4", "device_idle"), figure(r, "20x1", "device_idle"), ".0%")
            rows.append(
                f"{head} | rerank ({rerank['per_query']} per query) | {r['name']} | "
                f"{fmt(four)} pairs/s (20x4) | {fmt(one)} pairs/s (20x1) | "
                f"{fmt(best / rerank_ceiling(own_ceiling(c, r), 'fp32'), '.0%')} | "
                f"{fmt(best / rerank_ceiling(own_ceiling(c, r), own_dtype(r['name'])), '.0%')} | "
                f"score diff {fmt(r.get('score_diff', NAN), '.1e')} | {idle} | - |"
            )
    return rows


def append_history(data: dict[str, Any], path: Path) -> None:
    lines = path.read_text().splitlines() if path.exists() else []
    rows = [widen(line) for line in lines if line.startswith("| 2")]
    path.write_text("\n".join([*HISTORY_HEADER, *rows, *history_rows(data)]) + "\n")


def widen(row: str) -> str:
    """A row of the first history table (run, command, method, 32x4, 1xN, share of the fp32
    ceiling, short p50; all of them all-MiniLM-L6-v2 unless the command named a model) in
    today's columns."""
    cells = [c.strip() for c in row.strip().strip("|").split(" | ")]
    if len(cells) != 7:
        return row
    run, command, method, bulk, single, share, short = cells
    model = "(--model)" if "--model" in command else "all-MiniLM-L6-v2"
    return (
        f"| {run} | {command} | {model} | {method} | {bulk} | {single} | {share} | - | - | - | "
        f"{short} |"
    )


# ---------------------------------------------------------------- plot


def line_styles(names: list[str]) -> list[dict[str, Any]]:
    """Each method's line: a colour of its own (matplotlib's default cycle has 10, and a full
    run plots 11 methods: two shared a colour), solid for vectorpress, dashed for its peers."""
    import matplotlib

    colours = matplotlib.colormaps["tab20"].colors
    # The dark half of tab20 first, then the light one.
    order = [*colours[0::2], *colours[1::2]]
    return [
        {
            "marker": "o",
            "label": name,
            "color": order[i % len(order)],
            "linestyle": "-" if name.startswith("vectorpress") else "--",
        }
        for i, name in enumerate(names)
    ]


def plot(suite: Suite, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    st = next(r for r in suite.results if r.name.startswith("sentence-transformers"))
    sweep = suite.sweep
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    plotted = [r for r in suite.results if any(f"1x{c}" in r.load for c in sweep)]
    for r, style in zip(plotted, line_styles([r.name for r in plotted]), strict=True):
        xs = [c for c in sweep if f"1x{c}" in r.load]
        ax1.plot(xs, [r.load[f"1x{c}"]["tokens_per_s"] for c in xs], **style)
        ax2.plot(xs, [r.load[f"1x{c}"]["p99_ms"] for c in xs], **style)
    ax1.axhline(figure(st, "encode32"), color="grey", linestyle="--",
                label="sentence-transformers encode")  # fmt: skip
    ax1.set(xscale="log", xlabel="one-text requests in flight", ylabel="tokens/s",
            title=f"Throughput, {suite.label}")  # fmt: skip
    ax2.set(xscale="log", yscale="log", xlabel="one-text requests in flight",
            ylabel="p99 latency (ms)", title="p99 latency")  # fmt: skip
    for ax in (ax1, ax2):
        ax.set_xticks(sweep, [str(c) for c in sweep])
        ax.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
