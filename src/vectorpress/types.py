"""Plain data passed between the pipeline stages and the backends."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from enum import Enum
from itertools import chain

import numpy as np


class Truncation(str, Enum):
    RIGHT = "right"
    LEFT = "left"


class OutputKind(str, Enum):
    """What an entry wants back from the forward pass."""

    POOLED = "pooled"
    """A pooled vector (Dense applied), SPLADE vector, or class logits."""
    RAW = "raw"
    """The last hidden state of every token."""
    MULTI = "multi"
    """A model's several outputs from one pass (bge-m3: dense, sparse, ColBERT; a ColBERT
    model: its per-token vectors), as a dict of arrays."""


@dataclass(frozen=True)
class Encoding:
    """One tokenized, truncated input."""

    ids: list[int]
    type_ids: list[int]
    position_offset: int = 0
    chars: int = 0
    truncated: bool = False
    probe: bool = False
    """A health check's input: run like any other, left out of the batch metrics (in TEI a
    health check calls the backend directly and is never a batch)."""
    attended: int | None = None
    """Tokens may attend to the first `attended` tokens only (a ColBERT query's expansion
    tokens are held out); None: to all."""

    def __len__(self) -> int:
        return len(self.ids)


@dataclass
class Timings:
    """Seconds spent per stage for one input (or the mean over a request's inputs)."""

    tokenization: float = 0.0
    queue: float = 0.0
    inference: float = 0.0


@dataclass
class Entry:
    """One queued input waiting for its batch."""

    encoding: Encoding
    kind: OutputKind
    future: asyncio.Future[np.ndarray]
    loop: asyncio.AbstractEventLoop
    tokenization: float = 0.0
    queued_at: float = field(default_factory=time.perf_counter)
    queue_time: float = 0.0
    inference_time: float = 0.0

    @property
    def abandoned(self) -> bool:
        """The caller no longer waits for this entry (cancelled or disconnected)."""
        return self.future.done()


@dataclass(frozen=True)
class Batch:
    """A packed, backend-agnostic batch: real tokens only, sequences delimited by cu_seqlens."""

    input_ids: np.ndarray
    """(total_tokens,) int64"""
    token_type_ids: np.ndarray
    """(total_tokens,) int64"""
    position_ids: np.ndarray
    """(total_tokens,) int64"""
    cu_seqlens: np.ndarray
    """(n + 1,) int32: sequence i spans cu_seqlens[i]:cu_seqlens[i+1]"""
    max_seqlen: int
    pooled_indices: tuple[int, ...]
    """Sequences that want a pooled output, in order."""
    raw_indices: tuple[int, ...]
    """Sequences that want per-token outputs, in order."""
    probes: int = 0
    """Sequences that are health checks' inputs (Encoding.probe)."""
    probe_tokens: int = 0
    multi_indices: tuple[int, ...] = ()
    """Sequences that want the model's several outputs (OutputKind.MULTI), in order."""
    key_lengths: np.ndarray | None = None
    """(n,) int32: how many leading tokens of each sequence its tokens attend to; None when
    every token attends to the whole sequence."""

    @property
    def size(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def total_tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.cu_seqlens)

    @classmethod
    def from_encodings(
        cls, encodings: list[Encoding], kinds: list[OutputKind] | None = None
    ) -> Batch:
        kinds = kinds or [OutputKind.POOLED] * len(encodings)
        if len(encodings) == 1 and encodings[0].attended is None:
            return cls._of_one(encodings[0], kinds[0])
        return cls._of_many(encodings, kinds)

    @classmethod
    def _of_many(cls, encodings: list[Encoding], kinds: list[OutputKind]) -> Batch:
        lengths = [len(e) for e in encodings]
        cu = np.zeros(len(encodings) + 1, dtype=np.int32)
        np.cumsum(lengths, out=cu[1:])
        # Iterated in C: on a GPU this runs on the device thread, between passes.
        ids = np.fromiter(chain.from_iterable(e.ids for e in encodings), np.int64, cu[-1])
        types = np.fromiter(chain.from_iterable(e.type_ids for e in encodings), np.int64, cu[-1])
        positions = (
            np.concatenate(
                [
                    np.arange(e.position_offset, e.position_offset + len(e), dtype=np.int64)
                    for e in encodings
                ]
            )
            if encodings
            else np.zeros(0, dtype=np.int64)
        )
        key_lengths = None
        if any(e.attended is not None for e in encodings):
            key_lengths = np.array(
                [len(e) if e.attended is None else e.attended for e in encodings], dtype=np.int32
            )
        return cls(
            input_ids=ids,
            token_type_ids=types,
            position_ids=positions,
            cu_seqlens=cu,
            max_seqlen=max(lengths, default=0),
            pooled_indices=tuple(i for i, k in enumerate(kinds) if k is OutputKind.POOLED),
            raw_indices=tuple(i for i, k in enumerate(kinds) if k is OutputKind.RAW),
            probes=sum(1 for e in encodings if e.probe),
            probe_tokens=sum(len(e) for e in encodings if e.probe),
            multi_indices=tuple(i for i, k in enumerate(kinds) if k is OutputKind.MULTI),
            key_lengths=key_lengths,
        )

    @classmethod
    def _of_one(cls, e: Encoding, kind: OutputKind) -> Batch:
        """A batch of one input that attends to all its tokens (most interactive ones): a
        third of the numpy calls, which run with the caches cold from the pass before (105
        against 39 us, in-process after reading 64 MiB)."""
        n = len(e)
        return cls(
            input_ids=np.array(e.ids, dtype=np.int64),
            token_type_ids=np.array(e.type_ids, dtype=np.int64),
            position_ids=np.arange(e.position_offset, e.position_offset + n, dtype=np.int64),
            cu_seqlens=np.array([0, n], dtype=np.int32),
            max_seqlen=n,
            pooled_indices=(0,) if kind is OutputKind.POOLED else (),
            raw_indices=(0,) if kind is OutputKind.RAW else (),
            probes=int(e.probe),
            probe_tokens=n if e.probe else 0,
            multi_indices=(0,) if kind is OutputKind.MULTI else (),
        )


@dataclass(frozen=True)
class BatchOutput:
    """What a backend returns for one batch.

    ``pooled`` has one row per entry of ``pooled_indices`` (embedding vectors, SPLADE vectors or
    class logits); ``raw`` one (tokens, hidden) array per entry of ``raw_indices``; ``multi`` one
    dict of named arrays per entry of ``multi_indices`` (see `MultiOutput` keys).
    """

    pooled: np.ndarray | None
    raw: list[np.ndarray]
    multi: list[dict[str, np.ndarray]] = field(default_factory=list)


@dataclass(frozen=True)
class MultiOutput:
    """What /embed_multi gives for one input: the parts asked for, the others None."""

    dense: np.ndarray | None = None
    """The pooled vector (normalized unless asked otherwise)."""
    sparse: tuple[np.ndarray, np.ndarray] | None = None
    """Token ids (ascending) and their weights."""
    colbert: np.ndarray | None = None
    """`(tokens, dim)`, one normalized vector per token."""
