"""TEI's timing and compute headers, from a Result."""

from __future__ import annotations

from typing import Any

from vectorpress.core.infer import Result


def timing_headers(result: Result[Any]) -> dict[str, str]:
    total_ms = str(int(result.total_time * 1000))
    headers = {
        "x-compute-type": "gpu+optimized",
        "x-compute-time": total_ms,
        "x-compute-characters": str(result.chars),
        "x-compute-tokens": str(result.tokens),
        "x-total-time": total_ms,
    }
    if result.timings is not None:
        headers["x-tokenization-time"] = str(int(result.timings.tokenization * 1000))
        headers["x-queue-time"] = str(int(result.timings.queue * 1000))
        headers["x-inference-time"] = str(int(result.timings.inference * 1000))
    return headers
