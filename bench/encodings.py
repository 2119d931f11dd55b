"""Response bytes and serialization time of each embedding encoding.

    .venv/bin/python bench/encodings.py        # a few seconds; writes bench/results/encodings.md

For 32 vectors of 384 and of 1,024 dimensions (unit-norm, seeded), each encoding goes through
the same code the routes run: `api/encodings.py` from the float32 matrix the pipeline returns,
then orjson of OpenAI's response shape (`data[i].embedding`), as /v1/embeddings answers it.
int8/uint8 ranges come from 200 other seeded vectors, as the calibration texts' would. Times
are the median of repeated runs in this process; they are indicative on a shared machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from vectorpress.api import encodings
from vectorpress.core.calibration import Calibration

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


def median_us(fn: Callable[[], object]) -> float:
    times = []
    for _ in range(REPEATS):
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
        f"of {REPEATS} runs (indicative: shared machine). Written by bench/encodings.py.",
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
    text = "\n".join(lines) + "\n"
    RESULTS.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
