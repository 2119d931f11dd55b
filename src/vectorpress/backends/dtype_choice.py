"""`--dtype auto`: bfloat16 where this CPU multiplies it natively and the model's vectors hold
it, float32 otherwise; on a GPU, the backend's own default.

bfloat16 runs a MiniLM 2.4x float32 on an AMX Xeon (docs/performance.md), but whether a model's
vectors hold cosine >= 0.999 to float32 depends on the model: all-mpnet-base-v2 on OpenVINO
falls to 0.99889 on one benchmark text. So the choice is checked per model at start-up: a
float32 and a bfloat16 pass over the packaged calibration texts, bfloat16 kept only if every
text's pooled vector stays within `CHECK_BOUND` of float32's. Those 38 texts find a model's
worst case less surely than the benchmark's corpus, hence a bound ten times tighter than the
corpus's 0.999 (measured on the AMX Xeon: calibration worst 0.99993 / 0.99998 for MiniLM on
torch / OpenVINO, whose corpus worst is 0.99990 / 0.99995; mpnet 0.99991 on torch, corpus
0.99920; 0.99981 on OpenVINO, corpus 0.99889, which the check therefore refuses).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable

import numpy as np

from vectorpress.backends.base import Backend
from vectorpress.cpus import native_bf16
from vectorpress.model_spec import ModelSpec

log = logging.getLogger(__name__)

# The accuracy the benchmark holds bfloat16 to over its corpus (issue bound), and the tighter
# one the calibration texts must meet to stand for it (see the module's note).
CORPUS_BOUND = 0.999
CHECK_BOUND = 1 - (1 - CORPUS_BOUND) / 10
# Backends that run bfloat16 on a CPU.
BF16_BACKENDS = ("torch", "hf", "openvino")

Build = Callable[[str | None], Backend]


def lowest_cosine(reference: np.ndarray, candidate: np.ndarray) -> float:
    """The lowest cosine between matching rows (float64, so the sum adds no error of its own)."""
    a = np.asarray(reference, dtype=np.float64)
    b = np.asarray(candidate, dtype=np.float64)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cos = (a * b).sum(axis=1) / np.maximum(norms, np.finfo(np.float64).tiny)
    return float(cos.min())


def refusal(spec: ModelSpec, device: str, backend: str) -> str | None:
    """Why bfloat16 cannot be tried for this model here, or None if it can be."""
    if not native_bf16():
        return "this CPU has no AVX512-BF16 or AMX (bfloat16 would run emulated, slower)"
    if backend not in BF16_BACKENDS:
        return f"--backend {backend} runs no bfloat16"
    if spec.kind != "embedding":
        return f"a {spec.kind}'s scores have no accuracy bound to check bfloat16 against"
    if spec.outputs not in (("dense",), ("sparse",)):
        return "the check covers pooled vectors only, not per-token (ColBERT) outputs"
    return None


def choose(spec: ModelSpec, device: str, backend: str, build: Build) -> Backend:
    """The backend built in the dtype `--dtype auto` picks for `spec` on `device`.

    `build(dtype)` builds the backend in that dtype (None: the device's default)."""
    if device != "cpu":
        log.info("--dtype auto on %s: the backend's default for the device", device)
        return build(None)
    why = refusal(spec, device, backend)
    if why is not None:
        log.info("--dtype auto: float32, as %s", why)
        return build("float32")
    from vectorpress.backends.common.calibration import calibration_batch

    batch = calibration_batch(spec)
    reference = build("float32")
    expected = reference.embed(batch).pooled
    # One model in memory at a time: the float32 one goes before the bfloat16 one loads.
    del reference
    gc.collect()
    candidate = build("bfloat16")
    got = candidate.embed(batch).pooled
    if expected is None or got is None:  # refusal() rules this out; said plainly if not
        raise RuntimeError("the calibration pass gave no pooled vectors")
    worst = lowest_cosine(expected, got)
    if worst >= CHECK_BOUND:
        log.info(
            "--dtype auto: bfloat16 (lowest cosine to float32 over %d calibration texts %.5f, "
            "bound %.4f)",
            batch.size,
            worst,
            CHECK_BOUND,
        )
        return candidate
    log.warning(
        "--dtype auto: float32, as bfloat16 moved a calibration text's vector to cosine %.5f of "
        "float32's (bound %.4f)",
        worst,
        CHECK_BOUND,
    )
    del candidate
    gc.collect()
    return build("float32")
