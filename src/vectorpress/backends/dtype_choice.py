"""`--dtype auto`: bfloat16 where this CPU multiplies it natively and the model's vectors hold
it, float32 otherwise; on a GPU, the backend's own default.

bfloat16 runs a MiniLM 2.4x float32 on an AMX Xeon (docs/performance.md), but whether a model's
vectors hold cosine >= 0.999 to float32 depends on the model: all-mpnet-base-v2 on OpenVINO
falls to 0.99889 on one benchmark text. So the choice is checked per model at start-up, on a
float32 and a bfloat16 pass over the packaged calibration texts: bfloat16 is kept only if every
token's last hidden state stays at cosine >= `TOKEN_BOUND` to float32's, and every text's
pooled vector at >= `CORPUS_BOUND`. The 38 texts' pooled vectors alone find a model's worst case
less surely than the benchmark's 1,200-text corpus; their 1,030 tokens' states find it better.
Measured on an AMX Xeon (lowest cosine; calibration tokens / calibration vectors / corpus
vectors): MiniLM on torch 0.99986 / 0.99993 / 0.99990, on OpenVINO 0.99995 / 0.99998 / 0.99995;
mpnet on torch 0.99967 / 0.99991 / 0.99920 (its relative position bias since kept in float32:
corpus 0.99989 on a Zen 5), on OpenVINO 0.99873 / 0.99981 / 0.99889. The token
bound sits between mpnet's two backends, the one that holds the corpus bound and the one that
does not, and leaves MiniLM a margin of 3.6x in 1 - cosine.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable

import numpy as np

from vectorpress.backends.base import Backend
from vectorpress.cpus import native_bf16
from vectorpress.errors import StartupError
from vectorpress.model_spec import ModelSpec
from vectorpress.types import Batch, BatchOutput, OutputKind

log = logging.getLogger(__name__)

# The accuracy the benchmark holds bfloat16 to over its corpus, and the one the calibration
# tokens must meet to stand for it (see the module's note).
CORPUS_BOUND = 0.999
TOKEN_BOUND = 0.9995
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


def refusal(spec: ModelSpec, backend: str) -> str | None:
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


def check_batch(spec: ModelSpec) -> Batch:
    """The calibration texts, each twice: for its pooled vector and its tokens' hidden states."""
    from vectorpress.backends.common.calibration import calibration_encodings

    encodings = calibration_encodings(spec)
    n = len(encodings)
    return Batch.from_encodings(encodings * 2, [OutputKind.POOLED] * n + [OutputKind.RAW] * n)


def compare(expected: BatchOutput, got: BatchOutput) -> tuple[float, float]:
    """The lowest cosine over the tokens' hidden states, and over the pooled vectors."""
    if expected.pooled is None or got.pooled is None:  # refusal() rules this out
        raise RuntimeError("the calibration pass gave no pooled vectors")
    tokens = lowest_cosine(np.concatenate(expected.raw), np.concatenate(got.raw))
    return tokens, lowest_cosine(expected.pooled, got.pooled)


def measure(batch: Batch, build: Build) -> tuple[Backend, float, float]:
    """The bfloat16 backend, and how far its outputs of `batch` moved from float32's (`compare`).

    One model in memory at a time: the float32 one goes before the bfloat16 one loads."""
    reference = build("float32")
    expected = reference.embed(batch)
    del reference
    gc.collect()
    candidate = build("bfloat16")
    return candidate, *compare(expected, candidate.embed(batch))


def holds(tokens: float, pooled: float) -> bool:
    """Whether bfloat16 keeps what the calibration texts measured within the bounds."""
    return tokens >= TOKEN_BOUND and pooled >= CORPUS_BOUND


def choose(spec: ModelSpec, device: str, backend: str, build: Build) -> Backend:
    """The backend built in the dtype `--dtype auto` picks for `spec` on `device`.

    `build(dtype)` builds the backend in that dtype (None: the device's default)."""
    if device != "cpu":
        log.info("--dtype auto on %s: the backend's default for the device", device)
        return build(None)
    why = refusal(spec, backend)
    if why is not None:
        log.info("--dtype auto: float32, as %s", why)
        return build("float32")
    batch = check_batch(spec)
    try:
        candidate, tokens, pooled = measure(batch, build)
    except (StartupError, RuntimeError) as exc:
        # A backend or build that cannot run bfloat16 here after all (a plugin without it):
        # float32 serves, as it would without the flag.
        log.warning("--dtype auto: float32, as bfloat16 did not run here: %s", exc)
        gc.collect()
        return build("float32")
    n = batch.size // 2
    held = f"over {n} calibration texts: tokens {tokens:.5f}, vectors {pooled:.5f}"
    bounds = f"bounds {TOKEN_BOUND} and {CORPUS_BOUND}"
    if holds(tokens, pooled):
        log.info("--dtype auto: bfloat16 (lowest cosine to float32 %s; %s)", held, bounds)
        return candidate
    log.warning("--dtype auto: float32, as bfloat16 moved %s (%s)", held, bounds)
    del candidate
    gc.collect()
    return build("float32")
