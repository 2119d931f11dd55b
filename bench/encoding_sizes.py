"""Response bytes and serialization time of each embedding encoding.

    .venv/bin/python bench/encoding_sizes.py   # a few seconds; writes bench/results/encodings.md

For 32 vectors of 384 and of 1,024 dimensions (unit-norm, seeded), each encoding goes through
the same code the routes run: `api/encodings.py` from the float32 matrix the pipeline returns,
then orjson of OpenAI's response shape (`data[i].embedding`), as /v1/embeddings answers it.
int8/uint8 ranges come from 200 other seeded vectors, as the calibration texts' would.

Multi-vector responses (/embed_multi): per-token vectors (unit-norm, seeded) of 8 documents of
180 tokens at 128 dimensions (a PyLate ColBERT) and of 4 texts of 100 tokens at 1,024 (bge-m3's
ColBERT head), through the route's own payload code (`multi_payload`, the shared encoder) and
the chunked JSON writer the route answers with (`api/answers.py`).

Times are the median of repeated runs in this process; they are indicative on a shared machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from vectorpress.api import answers, encodings
from vectorpress.api.native.embed import multi_payload
from vectorpress.api.native.schemas import EmbedMultiRequest
from vectorpress.core.calibration import Calibration
from vectorpress.types import MultiOutput

RESULTS = Path(__file__).with_name("results") / "encodings.md"
ROWS = 32
REPEATS = 200

#: (name, dtype, base64)
CASES = [
    ("float (JSON)", "float32", False),
    ("float32 base64", "float32", True),
    ("float16 base64", "float16", True),
    ("bfloat16 base64", "bfloat16", True),
    ("int8 (JSON)", "int8", False),
    ("uint8 (JSON)", "uint8", False),
    ("int8 base64", "int8", True),
    ("binary (JSON)", "binary", False),
    ("ubinary (JSON)", "ubinary", False),
    ("binary base64", "binary", True),
]


#: /embed_multi's (name, dtype, encoding_format); int8/uint8 have no ranges for token vectors.
MULTI_CASES = [
    ("float (JSON)", "float32", "float"),
    ("float16 (JSON)", "float16", "float"),
    ("float32 base64", "float32", "base64"),
    ("float16 base64", "float16", "base64"),
    ("bfloat16 base64", "bfloat16", "base64"),
    ("binary (JSON)", "binary", "float"),
    ("binary base64", "binary", "base64"),
    ("ubinary base64", "ubinary", "base64"),
]
#: (texts, tokens per text, dims) of a multi-vector response.
MULTI_SHAPES = [(8, 180, 128), (4, 100, 1024)]
MULTI_REPEATS = 50


def unit_rows(rng: np.random.Generator, n: int, dims: int) -> np.ndarray:
    matrix = rng.standard_normal((n, dims)).astype(np.float32)
    return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


def response(matrix: np.ndarray, dtype: str, b64: bool, calibration: Calibration) -> bytes:
    converted = encodings.convert(matrix, dtype, calibration)
    values: Any = (
        encodings.to_base64(converted, dtype) if b64 else encodings.to_json(converted, dtype)
    )
    payload = {
        "object": "list",
        "data": [{"object": "embedding", "embedding": v, "index": i} for i, v in enumerate(values)],
        "model": "m",
        "usage": {"prompt_tokens": 0, "total_tokens": 0},
    }
    return orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def multi_response(outputs: list[MultiOutput], dtype: str, fmt: str) -> bytes:
    body = EmbedMultiRequest.model_validate({"inputs": "x", "dtype": dtype, "encoding_format": fmt})
    return answers.dumps([multi_payload(out, body) for out in outputs])


def median_us(fn: Callable[[], object], repeats: int = REPEATS) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e6


def main() -> None:
    rng = np.random.default_rng(0)
    lines = [
        "# Embedding encodings: response bytes and serialization time",
        "",
        f"{ROWS} vectors per response; time = encode + orjson of OpenAI's response shape, median "
        f"of {REPEATS} runs (indicative: shared machine). Written by bench/encoding_sizes.py.",
        "",
        "| encoding | dims | bytes | vs float JSON | serialize (us) |",
        "|---|---|---|---|---|",
    ]
    for dims in (384, 1024):
        matrix = unit_rows(rng, ROWS, dims)
        calibration = Calibration(unit_rows(rng, 200, dims))
        calibration.ranges(None, True)  # computed once at start-up in the server too
        baseline = len(response(matrix, "float32", False, calibration))
        for name, dtype, b64 in CASES:
            size = len(response(matrix, dtype, b64, calibration))
            took = median_us(lambda m=matrix, c=calibration, d=dtype, b=b64: response(m, d, b, c))
            lines.append(f"| {name} | {dims} | {size:,} | {size / baseline:.3f} | {took:.0f} |")
    lines += [
        "",
        "## Multi-vector responses (/embed_multi, per-token vectors)",
        "",
        "Time = the route's payload code (shared encoder) + its chunked JSON writer, median of "
        f"{MULTI_REPEATS} runs (indicative: shared machine).",
        "",
        "| encoding | texts x tokens x dims | bytes | vs float JSON | serialize (ms) | "
        "vs float JSON |",
        "|---|---|---|---|---|---|",
    ]
    for texts, tokens, dims in MULTI_SHAPES:
        outputs = [MultiOutput(colbert=unit_rows(rng, tokens, dims)) for _ in range(texts)]
        base_bytes = len(multi_response(outputs, "float32", "float"))
        base_us = 0.0  # the first case's, float JSON, measured in the same loop
        for name, dtype, fmt in MULTI_CASES:
            size = len(multi_response(outputs, dtype, fmt))
            took = median_us(
                lambda o=outputs, d=dtype, f=fmt: multi_response(o, d, f), MULTI_REPEATS
            )
            base_us = base_us or took
            lines.append(
                f"| {name} | {texts} x {tokens} x {dims} | {size:,} | {size / base_bytes:.3f} "
                f"| {took / 1000:.2f} | {took / base_us:.2f} |"
            )
    text = "\n".join(lines) + "\n"
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
