"""How vectors are stored in a job's Parquet output: Arrow columns, one encoding per job."""

from __future__ import annotations

from typing import Any

import numpy as np

ENCODINGS = ("float32", "float16", "int8", "binary")


def encode_dense(vectors: np.ndarray, encoding: str) -> Any:
    """(n, dim) float32 -> a `fixed_size_list` column of the chosen encoding.

    int8 scales by 127 and rounds, which keeps the whole range of a normalized vector's
    components ([-1, 1]); binary keeps the sign bits, packed 8 to a byte (dim / 8 bytes, first
    component in the highest bit), as the binary encodings of embedding APIs do.
    """
    import pyarrow as pa

    values: np.ndarray
    if encoding == "float32":
        values, width = vectors.astype(np.float32, copy=False), vectors.shape[1]
    elif encoding == "float16":
        values, width = vectors.astype(np.float16), vectors.shape[1]
    elif encoding == "int8":
        values = np.clip(np.rint(vectors * 127.0), -127, 127).astype(np.int8)
        width = vectors.shape[1]
    elif encoding == "binary":
        values = np.packbits(vectors > 0, axis=1)
        width = values.shape[1]
    else:
        raise ValueError(f"unknown encoding {encoding!r}")
    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, width)


def sparse_type() -> Any:
    import pyarrow as pa

    return pa.list_(pa.struct([("index", pa.int32()), ("value", pa.float32())]))


def encode_sparse(vectors: list[tuple[np.ndarray, np.ndarray]]) -> Any:
    """(indices, values) per row -> `list<struct<index: int32, value: float32>>`."""
    import pyarrow as pa

    offsets = np.zeros(len(vectors) + 1, dtype=np.int32)
    offsets[1:] = np.cumsum([len(i) for i, _ in vectors])
    indices = np.concatenate([i for i, _ in vectors]) if vectors else np.zeros(0)
    values = np.concatenate([v for _, v in vectors]) if vectors else np.zeros(0)
    structs = pa.StructArray.from_arrays(
        [pa.array(indices.astype(np.int32)), pa.array(values.astype(np.float32))],
        names=["index", "value"],
    )
    return pa.ListArray.from_arrays(pa.array(offsets), structs, type=sparse_type())
