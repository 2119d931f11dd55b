"""bench/run.py's report: the targets it judges, the history it keeps, the rerank load it sends."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from bench.corpus import corpus, kind
from bench.report import (
    Result,
    Suite,
    append_history,
    auto_lines,
    history_rows,
    line_styles,
    profile_lines,
    targets,
    widen,
)
from bench.rerank import PER_QUERY, rerank_queries

CEILING = {"fp32_gflops": 100.0, "bf16_gflops": 200.0, "flops_per_token": 1e7, "gemm_shape": "-"}
"""10,000 tokens/s in fp32, 20,000 in bf16."""


def served(name: str, bulk: float, single: float, cos: float = 1.0) -> Result:
    r = Result(name, cos_min=cos, cos_mean=cos)
    r.load = {"32x4": {"tokens_per_s": bulk}, "1x64": {"tokens_per_s": single}}
    r.short_p50_ms, r.overhead_ms = 2.5, 0.4
    return r


def suite(*results: Result) -> Suite:
    st = Result("sentence-transformers encode (in-process)", {"encode32": {"tokens_per_s": 1.0}})
    return Suite("m", Path("."), ["a"], [1], [1, 64], dict(CEILING), [st, *results])


def verdicts(rows: list[dict[str, object]]) -> dict[str, object]:
    return {str(r["what"]).split(",")[0].split(" (")[0]: r["met"] for r in rows}


def test_targets_judge_each_share_against_its_own_ceiling() -> None:
    rows = targets(
        [
            suite(
                served("vectorpress fp32", 7_600, 8_000),  # 76% / 80% of 10,000
                served("vectorpress bf16", 13_200, 12_000, cos=0.9995),  # 66% / 60% of 20,000
                served("vectorpress int8 (torch)", 18_000, 16_000, cos=0.989),  # too coarse
                served("vectorpress onnx int8 (`--dtype int8`)", 17_200, 16_000, cos=0.995),
                served("Infinity 0.0.78 torch", 1_900, 2_100),
            )
        ],
        None,
    )
    got = verdicts(rows)
    assert got["fp32 over HTTP"] is True
    assert got["bf16 over HTTP"] is False  # 60% on one-text requests
    assert got["bf16 lowest cosine to fp32 over every corpus text"] is True
    # The best int8 is the fastest one that holds 0.99: 17,200 / 13,200 and 16,000 / 12,000.
    (int8,) = [r for r in rows if str(r["what"]).startswith("int8")]
    assert "onnx int8" in str(int8["what"]) and int8["figure"] == "1.30x / 1.33x"
    assert int8["met"] is True
    assert got["one short query over HTTP"] is True
    assert got["server overhead on it"] is True
    assert got["fp32 x Infinity's faster engine"] is False  # 8,000 / 2,100 on one-text requests
    (vs,) = [r for r in rows if str(r["what"]).startswith("fp32 x Infinity")]
    assert vs["figure"] == "4.00x / 3.81x"


def test_targets_not_measured_are_not_met_nor_failed() -> None:
    rows = targets([suite(served("vectorpress fp32", 5_000, 5_000))], None)
    got = verdicts(rows)
    assert got["fp32 over HTTP"] is False
    assert got["bf16 over HTTP"] is None
    assert got["fp32 x Infinity's faster engine"] is None


def test_without_native_bf16_int8_is_judged_against_fp32() -> None:
    no_bf16 = suite(
        served("vectorpress fp32", 6_000, 5_000),
        served("vectorpress openvino int8", 5_100, 4_300, cos=0.998),  # weight-only: slower
        served("vectorpress onnx int8 (`--dtype int8`)", 8_400, 6_500, cos=0.995),
    )
    no_bf16.ceiling["bf16_gflops"] = None
    rows = targets([no_bf16], None)
    (int8,) = [r for r in rows if str(r["what"]).startswith("int8")]
    assert "onnx int8" in str(int8["what"]) and "/ fp32 (this CPU has no native bf16)" in str(
        int8["what"]
    )
    assert int8["figure"] == "1.40x / 1.30x" and int8["met"] is True
    assert verdicts(rows)["bf16 over HTTP"] is None


def test_the_history_widens_old_rows_and_adds_one_per_model_method_and_rerank(
    tmp_path: Path,
) -> None:
    path = tmp_path / "history.md"
    old = "| 20261129T123904Z | `python bench/run.py --quick` | vectorpress fp32 | 2,154 | 1,715 (1x64) | 63% | 18.8 |"  # noqa: E501
    path.write_text(
        "# Benchmark history\n\n| run | command | method |\n|---|---|---|\n" + old + "\n"
    )
    main = suite(served("vectorpress bf16", 13_000, 12_000, cos=0.9995))
    rerank_result = Result("vectorpress fp32", score_diff=1e-7)
    rerank_result.load = {"20x1": {"pairs_per_s": 40.0}, "20x4": {"pairs_per_s": 60.0}}
    data = {
        "meta": {"stamp": "S", "command": "c", "model": "m"},
        "ceiling": main.ceiling,
        "results": [asdict(r) for r in main.results],
        "second": [],
        "rerank": {
            "per_query": 20,
            "ceiling": {**CEILING, "tokens_per_pair": 100.0},
            "results": [asdict(rerank_result)],
        },
    }
    append_history(data, path)
    lines = path.read_text().splitlines()
    header = next(line for line in lines if line.startswith("| run"))
    columns = header.count(" | ") + 1
    rows = [line for line in lines if line.startswith("| 2") or line.startswith("| S")]
    assert len(rows) == 1 + 3
    assert all(row.count(" | ") + 1 == columns for row in rows), rows
    assert rows[0] == widen(old) and "| all-MiniLM-L6-v2 | vectorpress fp32 | 2,154 |" in rows[0]
    bf16 = next(r for r in rows if "vectorpress bf16" in r)
    assert "| 130% | 65% | 0.9995 / 0.9995 |" in bf16  # of fp32's ceiling, of bf16's
    assert "60 pairs/s (20x4) | 40 pairs/s (20x1) | 60% | 60% |" in rows[-1]
    assert history_rows(data) == rows[1:]


def test_rerank_queries_are_short_texts_each_with_twenty_medium_passages() -> None:
    queries = rerank_queries(5)
    assert len(queries) == 5 and all(len(p) == PER_QUERY for _, p in queries)
    pool = corpus(5 * PER_QUERY * 3, seed=1)
    medium = {t for i, t in enumerate(pool) if kind(i) == "medium"}
    short = {t for i, t in enumerate(pool) if kind(i) == "short"}
    assert all(q in short and set(p) <= medium for q, p in queries)
    assert len({p for _, ps in queries for p in ps}) == 5 * PER_QUERY


def test_targets_take_the_fastest_backend_of_each_dtype_and_name_it() -> None:
    quick = served("vectorpress openvino fp32", 7_000, 9_000)  # slower on 32x4: 70% < 75%
    quick.short_p50_ms = 2.0
    rows = targets(
        [
            suite(
                served("vectorpress fp32", 7_600, 8_000),
                quick,
                served("vectorpress bf16", 13_200, 12_000, cos=0.9995),
                served("vectorpress openvino bf16", 14_000, 13_500, cos=0.9996),  # 70% / 68%
            )
        ],
        None,
    )
    by = {str(r["what"]).split(" (")[0].split(",")[0]: r for r in rows}
    assert by["fp32 over HTTP"]["met"] is True  # torch's 76% / 80%, its slower load the higher
    assert "[vectorpress fp32]" in str(by["fp32 over HTTP"]["what"])
    assert by["bf16 over HTTP"]["met"] is True
    assert "[vectorpress openvino bf16]" in str(by["bf16 over HTTP"]["what"])
    short = next(r for r in rows if str(r["what"]).startswith("one short query"))
    assert short["figure"] == "2.00 ms" and "[vectorpress openvino fp32]" in str(short["what"])


def test_the_best_backend_is_chosen_by_its_shares_of_its_own_ceiling() -> None:
    # More tokens/s on both loads, in a faster stretch of the run: 73% / 66% of its 11,000.
    fast_hour = served("vectorpress openvino fp32", 8_000, 7_300)
    fast_hour.gflops = {"fp32": 110.0}
    steady = served("vectorpress fp32", 7_900, 7_200)  # 79% / 72% of 10,000
    tied = served("vectorpress onnx fp32", 7_200, 7_200)  # 72% / 72%: the same weaker load
    for order in ((fast_hour, steady, tied), (tied, steady, fast_hour)):
        rows = targets([suite(*order)], None)
        fp32 = next(r for r in rows if str(r["what"]).startswith("fp32 over HTTP"))
        assert "[vectorpress fp32]" in str(fp32["what"]), fp32
        assert fp32["figure"] == "79% / 72%"


def test_a_slowed_gemm_reading_around_a_method_does_not_lift_its_shares() -> None:
    from bench.run import ceiling_around

    # A run of 2026-12-03 read 135 GFLOP/s before a server and 93 after it: its mean would have
    # credited the server with a fifth more of the ceiling than the steadier reading allows.
    assert ceiling_around({"fp32": 135.0}, {"fp32": 93.0}) == {"fp32": 135.0}
    assert ceiling_around({"fp32": 140.0, "bf16": 300.0}, {"fp32": 150.0}) == {"fp32": 150.0}


def test_attention_flops_follow_each_token_s_own_text_length() -> None:
    from bench.run import attended_length, flops_per_token

    # One text of 8 tokens and two of 1: 8 of the 10 tokens attend to 8 keys, 2 to 1 key.
    assert attended_length([8, 1, 1]) == (8 * 8 + 1 + 1) / 10
    config = {"hidden_size": 4, "intermediate_size": 16, "num_hidden_layers": 2}
    linear = 2 * (4 * 4 * 4 + 2 * 4 * 16)
    assert flops_per_token(config, 6.6) == 2 * (linear + 4 * 6.6 * 4)


def _bundled_layers() -> tuple[dict[str, Any], dict[str, Any]]:
    """The bundled checkpoint's config and its encoder layers' tensors but the LayerNorms', by
    name (numpy arrays)."""
    import json

    from safetensors import safe_open

    from vectorpress.hub import bundled_model_path

    folder = bundled_model_path()
    assert folder is not None
    config = json.loads((folder / "config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), "np") as weights:
        names = [n for n in weights.keys() if ".layer." in n and "LayerNorm" not in n]  # noqa: SIM118 (safe_open has no __iter__)
        return config, {name: weights.get_tensor(name) for name in names}


def test_short_query_floor_counts_every_linear_weight_of_the_checkpoint() -> None:
    from bench.short_query import linear_weight_bytes

    config, tensors = _bundled_layers()
    linear = sum(t.astype("float32").nbytes for t in tensors.values())
    assert linear_weight_bytes(config) == linear


def test_the_short_querys_gemm_passes_hold_the_checkpoints_linear_layers() -> None:
    """The floor's GEMMs are the model's own: per layer the checkpoint's linear weights (Q, K
    and V as one), and every layer's own weights when cold, the first layer's when hot."""
    import torch
    from bench.run import flops_per_token
    from bench.short_query import gemm_passes

    config, tensors = _bundled_layers()
    weights_per_layer = sum(
        t.size for name, t in tensors.items() if ".layer.0." in name and name.endswith(".weight")
    )
    layers = config["num_hidden_layers"]
    # What the floor's GFLOP/s divides by: two FLOPs per weight per row.
    assert flops_per_token(config, 0) == 2 * weights_per_layer * layers
    calls: list[tuple[int, int, int]] = []
    real = torch.ops.mkldnn._linear_pointwise

    def counting(x: torch.Tensor, w: torch.Tensor, *args: object) -> torch.Tensor:
        calls.append((x.shape[0], x.shape[1], id(w)))
        return real(x, w, *args)

    passes = gemm_passes(config, 5, only=("oneDNN",))
    assert set(passes) == {"oneDNN cold", "oneDNN hot"}  # what the floors time, and no more
    torch.ops.mkldnn._linear_pointwise = counting
    try:
        passes["oneDNN cold"]()
        cold = list(calls)
        calls.clear()
        passes["oneDNN hot"]()
        hot = list(calls)
    finally:
        torch.ops.mkldnn._linear_pointwise = real
    h, inner = config["hidden_size"], config["intermediate_size"]
    per_layer = [h, h, h, inner]  # each linear's input width: QKV, output, FFN in, FFN out
    assert [(rows, width) for rows, width, _ in cold] == [(5, w) for w in per_layer] * layers
    assert len({ptr for *_, ptr in cold}) == 4 * layers
    assert len({ptr for *_, ptr in hot}) == 4 and len(hot) == 4 * layers


def test_a_share_is_of_the_ceiling_measured_around_its_own_loads() -> None:
    # The machine ran at half speed around this method's loads: 3,800 tokens/s is 76% of the
    # 5,000 its GEMM then allowed, not 38% of the run's first 10,000.
    slow = served("vectorpress fp32", 3_800, 3_900)
    slow.gflops = {"fp32": 50.0}
    rows = targets([suite(slow)], None)
    fp32 = next(r for r in rows if str(r["what"]).startswith("fp32 over HTTP"))
    assert fp32["figure"] == "76% / 78%" and fp32["met"] is True
    # A result from before these figures (a history row) keeps the run's ceiling.
    assert (
        "38%"
        in history_rows(
            {
                "meta": {"stamp": "s", "command": "c", "model": "m"},
                "ceiling": CEILING,
                "results": [
                    {"name": "vectorpress fp32", "load": {"32x4": {"tokens_per_s": 3_800}}}
                ],
            }
        )[0]
    )


def test_the_machine_line_names_the_cpu_and_its_vector_units(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import bench.run as run

    zen3 = {"model name": "AMD EPYC", "cpu family": "25", "model": "1"}
    monkeypatch.setattr(run, "cpu_info", lambda: zen3)
    monkeypatch.setattr(run, "cpu_flags", lambda: frozenset({"fma", "avx2"}))
    assert run.cpu_name() == "AMD EPYC (family 25, model 1), AVX2"
    zen4 = {"model name": "AMD EPYC 9R14", "cpu family": "25", "model": "17"}
    monkeypatch.setattr(run, "cpu_info", lambda: zen4)
    avx512 = {"avx2", "avx512f", "avx512_bf16", "avx512_vnni"}
    monkeypatch.setattr(run, "cpu_flags", lambda: frozenset(avx512))
    assert run.cpu_name() == "AMD EPYC 9R14 (family 25, model 17), AVX-512 + BF16 + VNNI"
    # Where /proc/cpuinfo is unreadable the line still says what it can.
    monkeypatch.setattr(run, "cpu_info", dict)
    monkeypatch.setattr(run, "cpu_flags", frozenset)
    assert run.cpu_name().endswith(", no AVX2")


def test_the_auto_table_flags_a_bf16_pick_the_corpus_does_not_hold() -> None:
    results = suite(
        served("vectorpress bf16", 1, 1, cos=0.9992),
        served("vectorpress openvino bf16", 1, 1, cos=0.9988),
    )
    checks = [
        {"model": "m", "backend": "torch", "tokens": 0.9997, "vectors": 0.9999,
         "picks": "bfloat16"},
        {"model": "m", "backend": "openvino", "tokens": 0.9987, "vectors": 0.9998,
         "picks": "float32"},
    ]  # fmt: skip
    rows = [line for line in auto_lines(checks, [results]) if line.startswith("| m |")]
    assert rows == [
        "| m | torch | 0.99970 / 0.99990 | bfloat16 | 0.99920 | yes |",
        "| m | openvino | 0.99870 / 0.99980 | float32 | 0.99880 | yes (float32) |",
    ]
    checks[1]["picks"] = "bfloat16"  # a rule that let OpenVINO's bf16 through
    assert "| **no** |" in auto_lines(checks, [results])[-2]
    assert auto_lines([], [results]) == []


def test_each_plotted_method_gets_a_colour_of_its_own() -> None:
    names = [f"vectorpress m{i}" for i in range(9)] + ["Infinity torch", "Infinity optimum"]
    styles = line_styles(names)
    assert [s["label"] for s in styles] == names
    assert len({s["color"] for s in styles}) == len(names)
    assert [s["linestyle"] for s in styles] == ["-"] * 9 + ["--"] * 2


def test_the_pass_profile_shows_int8_beside_bf16_without_a_ceiling_of_its_own() -> None:
    def profiled(dtype: str, tokens_per_s: float, gemm: float) -> dict[str, Any]:
        rest = (1 - gemm) / 2
        return {"dtype": dtype, "tokens": 1000, "tokens_per_s": tokens_per_s, "gemm": gemm,
                "attention": rest, "other": rest, "gemm_gflops": 150.0}  # fmt: skip

    lines = profile_lines(
        [profiled("float32", 8_000, 0.86), profiled("bfloat16", 15_000, 0.8),
         profiled("int8", 19_500, 0.7)],
        suite(),
    )  # fmt: skip
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| ")}
    assert rows["| float32"].startswith("| float32 | 8,000 | 80% | 86% |")  # of 10,000 tok/s
    assert rows["| bfloat16"].startswith("| bfloat16 | 15,000 | 75% | 80% |")
    assert rows["| int8"] == "| int8 | 19,500 | - | 70% | 15% | 15% | 150 GFLOP/s, - |"
    text = " ".join(lines)
    assert "at most 1 / ((1 - g) + g / 2) = 1.67x the bf16 pass" in text
    assert "The int8 pass itself ran 1.30x the bf16 pass here, in-process" in text


def test_the_pass_profile_shows_an_int8_pass_on_the_kernel_without_shares() -> None:
    bf16 = {"dtype": "bfloat16", "tokens": 1000, "tokens_per_s": 15_000, "gemm": 0.8,
            "attention": 0.1, "other": 0.1, "gemm_gflops": 150.0}  # fmt: skip
    kernel = {"dtype": "int8", "tokens": 1000, "tokens_per_s": 25_000, "gemm": None,
              "attention": None, "other": None, "gemm_gflops": None}  # fmt: skip
    lines = profile_lines([bf16, kernel], suite())
    rows = {line.split(" | ")[0]: line for line in lines if line.startswith("| ")}
    assert rows["| int8"] == "| int8 | 25,000 | - | - | - | - | - GFLOP/s, - |"
    text = " ".join(lines)
    assert "ran 1.67x the bf16 pass here" in text and "no shares" in text
