"""Where the torch backend's pass spends its time, in-process: the corpus in arrival-order
batches of 32 texts (the 32-text load's batches, without the server), under torch's profiler,
its self CPU time split into the linear layers' GEMMs, attention and everything else.

What it bounds: a quantized path speeds up the GEMMs only, so int8 can outrun the float pass
it replaces by at most 1 / ((1 - g) + g / r), g the GEMM share of that pass and r how many times
faster its int8 GEMMs can run than its float ones (`INT8_PEAK_OVER_BF16`). The figure for a
CPU whose bf16 GEMMs run on AMX, where a large GEMM runs several times fp32's rate and
everything else does not, says what no int8 recipe can reach there.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

# The int8 dot-product units' peak over bf16's, per cycle: AMX-INT8 against AMX-BF16 (2,048
# against 1,024 operations a core), AVX512-VNNI's vpdpbusd against AVX512-BF16's vdpbf16ps
# (64 against 32 per 512-bit instruction).
INT8_PEAK_OVER_BF16 = 2.0

TEXTS_PER_BATCH = 32

# The least share of a profiled pass's wall time torch's ops must account for (their self CPU
# time over the wall time, two threads summed as one) for its shares to mean anything: an int8
# pass on the compiled kernel (`int8_kernel.py`) is one call outside them.
MIN_SEEN = 0.5


def op_kind(name: str) -> str:
    """'gemm', 'attention' or 'other' for a profiler op name."""
    low = name.lower()
    if "scaled_dot_product" in low or "flash_attention" in low or "vp_attention" in low:
        return "attention"
    gemms = ("linear", "addmm", "aten::mm", "aten::bmm", "matmul", "mkl_", "fbgemm", "quantized")
    if any(g in low for g in gemms):
        return "gemm"
    return "other"


def shares(self_times: dict[str, float]) -> dict[str, float]:
    """Each kind's share of the ops' summed self time (`self_times`: op name -> seconds)."""
    total = sum(self_times.values()) or 1.0
    out = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for name, seconds in self_times.items():
        out[op_kind(name)] += seconds / total
    return out


def int8_bound(gemm_share: float, speedup: float = INT8_PEAK_OVER_BF16) -> float:
    """How many times the float pass an int8 pass can run at most, with only its GEMMs (a
    `gemm_share` of the float pass's time) `speedup` times faster."""
    return 1.0 / ((1.0 - gemm_share) + gemm_share / speedup)


def gemm_flops_per_token(config: dict[str, Any]) -> float:
    """The encoder's linear layers per token: Q, K, V and the output (4 h^2), the FFN (2 h i)."""
    h, i, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    return float(layers * 2 * (4 * h * h + 2 * h * i))


def pass_profile(
    model: Path, texts: list[str], dtype: str, limit: int | None = None
) -> dict[str, Any]:
    """The torch backend's pass over `texts` (cut at `limit` tokens, default the model's
    max_length) in `dtype`: tokens/s
    unprofiled (the better of two runs), then one profiled run's shares and its GEMMs' rate
    (GFLOP/s while they ran); the shares and rate None where torch's ops took under
    MIN_SEEN of that run (a pass on a compiled kernel, one call outside them: int8's)."""
    import torch
    from bench.tokens import bench_tokenizer

    from vectorpress.backends.select import select_backend
    from vectorpress.model_spec import load_model_spec
    from vectorpress.settings import Settings
    from vectorpress.types import Batch, Encoding

    settings = Settings.single(str(model), backend="torch", dtype=dtype)
    spec = load_model_spec(model, settings.model)
    engine = select_backend(spec, settings.model)
    tok = bench_tokenizer(model, limit)
    encodings = [
        Encoding(ids=e.ids, type_ids=e.type_ids, position_offset=spec.position_offset)
        for e in tok.encode_batch(texts)
    ]
    batches = [
        Batch.from_encodings(encodings[i : i + TEXTS_PER_BATCH])
        for i in range(0, len(encodings), TEXTS_PER_BATCH)
    ]
    tokens = sum(b.total_tokens for b in batches)
    engine.embed(batches[0])
    best = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        for batch in batches:
            engine.embed(batch)
        best = min(best, time.perf_counter() - started)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        started = time.perf_counter()
        for batch in batches:
            engine.embed(batch)
        wall = time.perf_counter() - started
    self_times = {e.key: e.self_cpu_time_total / 1e6 for e in prof.key_averages()}
    seen = sum(self_times.values()) / wall
    out: dict[str, Any] = {"dtype": dtype, "tokens": tokens, "tokens_per_s": tokens / best}
    if seen < MIN_SEEN:
        return {**out, "gemm": None, "attention": None, "other": None, "gemm_gflops": None}
    split = shares(self_times)
    gemm_seconds = split["gemm"] * sum(self_times.values())
    config = json.loads((model / "config.json").read_text())
    return {
        **out,
        **split,
        "gemm_gflops": tokens * gemm_flops_per_token(config) / max(gemm_seconds, 1e-9) / 1e9,
    }
