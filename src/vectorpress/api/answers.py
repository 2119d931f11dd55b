"""Large answers built off the event loop, in chunks.

orjson and protobuf hold the interpreter lock for the whole of one call, so one call on a large
answer (the hidden states of 32 inputs, the tokens of 60,000 CJK characters) stops the event
loop, and every other request with it, even when made from another thread. Built on a thread
in chunks of about a millisecond, the loop takes the lock back between chunks (Python hands it
over every `sys.getswitchinterval()`) and goes on answering; and between chunks the builder
gives way to a running interactive forward pass (`core/giveway.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np
import orjson

from vectorpress.core import giveway

R = TypeVar("R")

#: Answers of up to this many values (numbers, tokens) are built on the event loop: a few
#: milliseconds at most, where the round trip to a thread costs a quarter of one.
INLINE_VALUES = 16_384

#: Values serialized in one orjson call of a large answer: about a millisecond of work.
CHUNK_VALUES = 8_192

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY


async def off_loop(values: int, fn: Callable[..., R], *args: Any) -> R:
    """`fn(*args)` on the event loop when the answer is small, else on a thread."""
    if values <= INLINE_VALUES:
        return fn(*args)
    return await asyncio.get_running_loop().run_in_executor(None, _giving_way, fn, args)


def _giving_way(fn: Callable[..., R], args: tuple[Any, ...]) -> R:
    with giveway.may_give_way():
        return fn(*args)


async def json_body(payload: object) -> bytes:
    """The JSON of `payload`, built off the loop (and in chunks) when it is large."""
    return await off_loop(size(payload), dumps, payload)


def size(payload: object) -> int:
    """About how many values `payload` holds; lists of dicts are estimated by their first."""
    if isinstance(payload, np.ndarray):
        return int(payload.size)
    if isinstance(payload, dict):
        return sum(size(v) for v in payload.values())
    if isinstance(payload, list | tuple):
        if not payload:
            return 0
        first = payload[0]
        if isinstance(first, dict):
            return len(payload) * size(first)
        if isinstance(first, list | tuple | np.ndarray):
            return sum(size(p) for p in payload)
        return len(payload)
    return 1


def dumps(payload: object) -> bytes:
    """orjson's bytes for `payload`, the same bytes, made in calls of about CHUNK_VALUES."""
    parts: list[bytes] = []
    _dump_into(parts, payload)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _dump_into(parts: list[bytes], payload: object) -> None:
    if isinstance(payload, list) and payload:
        if isinstance(payload[0], list | np.ndarray) and size(payload) > CHUNK_VALUES:
            parts.append(b"[")
            for i, item in enumerate(payload):
                if i:
                    parts.append(b",")
                    giveway.give_way()
                _dump_into(parts, item)
            parts.append(b"]")
            return
        if len(payload) > CHUNK_VALUES:
            step = max(1, CHUNK_VALUES * len(payload) // max(1, size(payload)))
            array_into(parts, (payload[i : i + step] for i in range(0, len(payload), step)))
            return
    if isinstance(payload, np.ndarray) and payload.ndim > 1 and payload.size > CHUNK_VALUES:
        rows = max(1, CHUNK_VALUES * len(payload) // payload.size)
        array_into(parts, (payload[i : i + rows] for i in range(0, len(payload), rows)))
        return
    parts.append(orjson.dumps(payload, option=_OPTIONS))


def array_into(parts: list[bytes], chunks: Iterable[object]) -> None:
    """Append one JSON array of the elements of every chunk (a list or an array), in order.

    Parts, not one bytes object: the answer is joined once at the end (a large bytes.join lets
    go of the interpreter lock; `+` on bytes does not).
    """
    parts.append(b"[")
    first = True
    for chunk in chunks:
        giveway.give_way()
        body = orjson.dumps(chunk, option=_OPTIONS)[1:-1]
        if body:
            if not first:
                parts.append(b",")
            parts.append(body)
            first = False
    parts.append(b"]")
