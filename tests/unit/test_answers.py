"""Large answers are made in chunks: the bytes must be orjson's own for the whole payload."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from vectorpress.api import answers


def _payloads() -> list[object]:
    rng = np.random.default_rng(0)
    hidden = [rng.standard_normal((n, 384)).astype(np.float32) for n in (1, 7, 300)]
    return [
        [],
        [[]],
        hidden,
        hidden[2],
        [v[0] for v in hidden] * 40,
        [{"index": i, "value": np.float32(i / 3)} for i in range(30_000)],
        [[{"index": i, "value": 0.5} for i in range(n)] for n in (0, 9_000, 20_000)],
        {"data": [{"embedding": v.tolist()} for v in hidden[2][:50]], "model": "m"},
        list(range(50_000)),
    ]


@pytest.mark.parametrize("payload", _payloads())
def test_chunked_json_is_orjsons(payload: object) -> None:
    assert answers.dumps(payload) == orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY)


def test_large_payloads_are_chunked() -> None:
    hidden = np.zeros((300, 384), dtype=np.float32)
    parts: list[bytes] = []
    answers._dump_into(parts, [hidden, hidden])
    assert len([p for p in parts if len(p) > 1]) >= 2 * (300 * 384 // answers.CHUNK_VALUES)
