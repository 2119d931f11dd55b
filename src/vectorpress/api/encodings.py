"""Output encodings of embedding vectors, shared by every dialect.

Each request's vectors are stacked once into one float32 matrix (after Matryoshka truncation and
normalization, as the pipeline returns them) and every encoding is one vectorized pass over it:

- `float`: the float32 values (JSON numbers); `float16`, `bfloat16`: rounded to that type
  (bfloat16, which numpy lacks, held as its 16 bits: float32's upper half, rounded to nearest
  even).
- `int8`, `uint8`: scalar quantization on the model's calibrated per-dimension ranges, exactly as
  sentence-transformers' `quantize_embeddings(..., ranges=...)`: 255 steps between the lowest
  and highest calibration value, floor, clipped.
- `binary`, `ubinary`: one sign bit per dimension (value > 0), packed 8 per byte, most
  significant bit first; `binary` shifts each byte by -128 to an int8 (Cohere's convention).

Any of them can go out as JSON numbers or as base64 of its little-endian bytes: one string per
vector, or (per-token vectors, /embed_multi) one string per matrix, row after row.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Literal, get_args

import numpy as np

from vectorpress.core.calibration import Calibration
from vectorpress.errors import ValidationError

Dtype = Literal["float32", "float16", "bfloat16", "int8", "uint8", "binary", "ubinary"]
DTYPES: tuple[str, ...] = get_args(Dtype)
QUANTIZED = ("int8", "uint8")

_LITTLE_ENDIAN: dict[str, np.dtype] = {
    "float32": np.dtype("<f4"),
    "float16": np.dtype("<f2"),
    "bfloat16": np.dtype("<u2"),
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "binary": np.dtype(np.int8),
    "ubinary": np.dtype(np.uint8),
}


def stack(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """The request's vectors as one (n, dims) float32 matrix (no copy when already one)."""
    if isinstance(vectors, np.ndarray):
        return vectors.astype(np.float32, copy=False)
    return np.stack(vectors).astype(np.float32, copy=False)


def quantize_scalar(
    matrix: np.ndarray, ranges: np.ndarray, dtype: Literal["int8", "uint8"]
) -> np.ndarray:
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    # A dimension that never varied on the calibration texts gets unit steps (no division by 0).
    steps = np.where(steps == 0, 1, steps).astype(np.float32)
    levels = np.clip(np.floor((matrix - starts) / steps), 0, 255)
    if dtype == "uint8":
        return levels.astype(np.uint8)
    return (levels - 128).astype(np.int8)


def bfloat16_bits(matrix: np.ndarray) -> np.ndarray:
    """The bfloat16 nearest each float32 value (ties to even), as its uint16 bit pattern."""
    bits = np.ascontiguousarray(matrix, dtype=np.float32).view(np.uint32)
    rounded = bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))
    return (rounded >> 16).astype(np.uint16)


def pack_signs(matrix: np.ndarray, signed: bool) -> np.ndarray:
    packed = np.packbits(matrix > 0, axis=-1)
    return (packed.astype(np.int16) - 128).astype(np.int8) if signed else packed


def convert(
    matrix: np.ndarray,
    dtype: str,
    calibration: Calibration | None = None,
    dimensions: int | None = None,
    normalize: bool = True,
) -> np.ndarray:
    """`matrix` (float32, n x dims) in `dtype`. int8/uint8 need the model's calibration; the
    ranges are those of the same `dimensions` and normalization as the matrix."""
    if dtype == "float32":
        return matrix
    if dtype == "float16":
        return matrix.astype(np.float16)
    if dtype == "bfloat16":
        return bfloat16_bits(matrix)
    if dtype in QUANTIZED:
        if calibration is None:
            raise ValidationError(
                f"Input validation error: `{dtype}` embeddings are not available for this model"
            )
        ranges = calibration.ranges(dimensions, normalize)
        return quantize_scalar(matrix, ranges, dtype)  # type: ignore[arg-type]
    if dtype == "binary":
        return pack_signs(matrix, signed=True)
    if dtype == "ubinary":
        return pack_signs(matrix, signed=False)
    raise ValidationError(f"Input validation error: unknown embedding type `{dtype}`")


def to_base64(array: np.ndarray, dtype: str) -> list[str]:
    """One standard base64 string per row, of the row's little-endian bytes."""
    wire = array.astype(_LITTLE_ENDIAN[dtype], copy=False)
    encode = base64.b64encode
    return [encode(row.tobytes()).decode("ascii") for row in wire]


def matrix_base64(array: np.ndarray, dtype: str) -> str:
    """One standard base64 string of the whole array's little-endian bytes, row after row."""
    wire = array.astype(_LITTLE_ENDIAN[dtype], copy=False)
    return base64.b64encode(np.ascontiguousarray(wire).tobytes()).decode("ascii")


def to_json(array: np.ndarray, dtype: str) -> np.ndarray:
    """What orjson writes as nested JSON numbers: the 16-bit floats go out as their float32
    values (exact), every other type as it is."""
    if dtype == "float16":
        return array.astype(np.float32)
    if dtype == "bfloat16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array


def check_dtype(name: str, allowed: Sequence[str] = DTYPES) -> str:
    if name not in allowed:
        raise ValidationError(
            f"Input validation error: unknown embedding type `{name}`; expected one of "
            + ", ".join(allowed)
        )
    return name
