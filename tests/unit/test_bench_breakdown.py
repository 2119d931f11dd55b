"""bench/breakdown.py: the in-process pass profile and the int8 bound the report draws from it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from bench import breakdown
from bench.breakdown import int8_bound, op_kind, pass_profile, shares
from bench.report import profile_lines, targets

from tests.unit.test_bench_report import served, suite


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("mkldnn::_linear_pointwise", "gemm"),
        ("aten::addmm", "gemm"),
        ("quantized::linear_dynamic", "gemm"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("aten::native_layer_norm", "other"),
        ("aten::gelu_", "other"),
    ],
)
def test_ops_are_told_apart(name: str, kind: str) -> None:
    assert op_kind(name) == kind


def test_shares_are_of_the_summed_self_time() -> None:
    got = shares({"aten::addmm": 3.0, "aten::scaled_dot_product_attention": 1.0, "aten::add_": 0})
    assert got == {"gemm": 0.75, "attention": 0.25, "other": 0.0}


def test_int8_can_win_only_on_the_gemms() -> None:
    assert int8_bound(0.0) == 1.0
    assert int8_bound(1.0) == 2.0
    assert int8_bound(1 / 3) == pytest.approx(1.2)


def test_the_report_says_what_int8_can_reach_over_bf16_here() -> None:
    results = suite(served("vectorpress fp32", 7_000, 7_000), served("vectorpress bf16", 1, 1))
    amx = [
        {"dtype": "float32", "tokens": 10, "tokens_per_s": 7_500.0, "gemm": 0.78,
         "attention": 0.16, "other": 0.06, "gemm_gflops": 80.0},
        {"dtype": "bfloat16", "tokens": 10, "tokens_per_s": 15_000.0, "gemm": 1 / 3,
         "attention": 0.37, "other": 0.30, "gemm_gflops": 150.0},
    ]  # fmt: skip
    (row,) = [r for r in targets([results], None, amx) if "most int8" in str(r["what"])]
    assert row["figure"] == "1.20x" and row["met"] is False
    wide = [dict(amx[1], gemm=0.8)]
    (row,) = [r for r in targets([results], None, wide) if "most int8" in str(r["what"])]
    assert row["figure"] == "1.67x" and row["met"] is True
    assert not [r for r in targets([results], None, amx[:1]) if "most int8" in str(r["what"])]
    text = "\n".join(profile_lines(amx, results))
    # 7,500 of fp32's 10,000 tokens/s; the GEMMs' 150 of bf16's 200 GFLOP/s.
    assert "| float32 | 7,500 | 75% | 78% | 16% | 6% |" in text
    assert "150 GFLOP/s, 75% |" in text and "1.20x the bf16 pass" in text


def test_the_profile_runs_the_torch_backend_and_splits_all_its_time(
    tiny_bert_family: Callable[..., Path],
) -> None:
    folder = tiny_bert_family()
    texts = ["a short one", "a somewhat longer text about the weather " * 3] * 40
    got = pass_profile(folder, texts, "float32", limit=64)
    assert got["tokens"] > len(texts) and got["tokens_per_s"] > 0
    assert got["gemm"] > 0 and got["attention"] > 0
    assert got["gemm"] + got["attention"] + got["other"] == pytest.approx(1.0)


def test_a_pass_the_profiler_barely_sees_gets_no_shares(
    tiny_bert_family: Callable[..., Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # As an int8 pass on the compiled kernel: torch's ops account for little of its time.
    monkeypatch.setattr(breakdown, "MIN_SEEN", 10.0)
    got = pass_profile(tiny_bert_family(), ["a short one"] * 8, "float32", limit=64)
    assert got["tokens_per_s"] > 0
    assert got["gemm"] is got["attention"] is got["other"] is got["gemm_gflops"] is None
