"""What the rerank, score and embed dialects share: documents as texts, `top_n`, per-request
token caps, prompts, ids and typed embeddings. Every dialect runs through `Infer`, so its scores
and vectors are those of TEI's routes for the same inputs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from starlette.requests import Request

from vectorpress.api import encodings
from vectorpress.api.routing import model_for
from vectorpress.core.infer import Infer, Result
from vectorpress.errors import EmptyError, ValidationError
from vectorpress.types import Truncation


def new_id(prefix: str = "") -> str:
    return f"{prefix}{uuid.uuid4()}"


def now() -> int:
    return int(time.time())


def document_text(document: str | dict[str, Any], rank_fields: Sequence[str] | None) -> str:
    """The text a document is ranked on: a string as it is, `{"text": ...}` its text; with
    `rank_fields`, those fields in that order as `field: value` lines (Cohere v1)."""
    if isinstance(document, str):
        return document
    if rank_fields:
        lines = [f"{field}: {document[field]}" for field in rank_fields if field in document]
        if not lines:
            raise ValidationError(
                "Input validation error: a document has none of the `rank_fields` "
                + ", ".join(rank_fields)
            )
        return "\n".join(lines)
    text = document.get("text")
    if not isinstance(text, str):
        raise ValidationError(
            "Input validation error: a document object needs a string `text` field "
            "(or give `rank_fields`)"
        )
    return text


def as_document(document: str | dict[str, Any]) -> dict[str, Any]:
    """A document as the answers echo it: `{"text": ...}` for a string, the object otherwise."""
    return {"text": document} if isinstance(document, str) else document


def check_top_n(top_n: int | None, n: int) -> int:
    """How many results to answer: all when `top_n` is absent; else 1..n."""
    if n == 0:
        raise EmptyError("Input validation error: `documents` cannot be empty")
    if top_n is None:
        return n
    if top_n <= 0:
        raise ValidationError("Input validation error: `top_n` must be a positive integer")
    if top_n > n:
        raise ValidationError(
            f"Input validation error: `top_n` ({top_n}) is larger than the number of "
            f"documents ({n})"
        )
    return top_n


async def cut_to_tokens(infer: Infer, texts: list[str], limit: int | None) -> list[str]:
    """Each text cut after its first `limit` tokens (special tokens not counted), for the
    dialects that cap tokens per document or per input."""
    if limit is None:
        return texts
    if limit <= 0:
        raise ValidationError("Input validation error: a token limit must be a positive integer")
    nonempty = [t for t in texts if t]
    if not nonempty:
        return texts
    tokens = iter(await infer.tokenize(nonempty, add_special_tokens=False))
    out: list[str] = []
    for text in texts:
        if not text:
            out.append(text)
            continue
        pieces = next(tokens)
        if len(pieces) <= limit:
            out.append(text)
            continue
        stop = pieces.stops[limit - 1] or 0
        out.append(text.encode("utf-8")[:stop].decode("utf-8", "ignore"))
    return out


async def rerank(
    infer: Infer,
    query: str,
    texts: list[str],
    *,
    top_n: int | None,
    raw_scores: bool = False,
    truncate: bool | None = None,
    direction: Truncation = Truncation.RIGHT,
    max_windows: int | None = None,
    priority: str | None = None,
) -> tuple[list[tuple[int, float]], Result[list[tuple[int, float]]]]:
    """(index, score) best first, at most `top_n`, and the pipeline's result."""
    keep = check_top_n(top_n, len(texts))
    result = await infer.rerank(
        query,
        texts,
        truncate=truncate,
        direction=direction,
        raw_scores=raw_scores,
        max_windows=max_windows,
        priority=priority,
    )
    return result.values[:keep], result


def prompt_for(infer: Infer, names: Sequence[str]) -> str | None:
    """The first of `names` that the model has a prompt for; None (no prompt) otherwise."""
    return next((name for name in names if name in infer.spec.prompts), None)


async def embed_matrix(
    infer: Infer,
    texts: list[str],
    *,
    truncate: bool | None = None,
    direction: Truncation = Truncation.RIGHT,
    prompt_name: str | None = None,
    normalize: bool = True,
    dimensions: int | None = None,
    batch: bool | None = True,
) -> tuple[np.ndarray, Result[list[np.ndarray]]]:
    """The vectors of `texts` as one float32 matrix (what every encoding is computed from)."""
    result = await infer.embed(
        texts,
        truncate=truncate,
        direction=direction,
        prompt_name=prompt_name,
        normalize=normalize,
        dimensions=dimensions,
        batch=batch,
    )
    return encodings.stack(result.values), result


def typed_embeddings(
    infer: Infer,
    matrix: np.ndarray,
    kinds: Sequence[str],
    *,
    dimensions: int | None,
    normalize: bool,
) -> dict[str, Any]:
    """Cohere's `embeddings` object: per requested type, one entry per input (`base64` is of
    the float32 bytes, as Cohere's)."""
    out: dict[str, Any] = {}
    for kind in kinds:
        if kind == "float":
            out["float"] = matrix
        elif kind == "base64":
            out["base64"] = encodings.to_base64(matrix, "float32")
        else:
            out[kind] = encodings.convert(
                matrix, kind, infer.calibration, dimensions=dimensions, normalize=normalize
            )
    return out


def served_name(request: Request, model: str | None) -> str:
    """The name answers echo: the served model's own, whatever alias the body gave."""
    return model_for(request, model).name


def truncation(mode: str) -> tuple[bool, Truncation]:
    """Cohere's `truncate`: NONE refuses long inputs, START drops their start, END their end."""
    if mode == "NONE":
        return False, Truncation.RIGHT
    return True, Truncation.LEFT if mode == "START" else Truncation.RIGHT
