"""The encoder's forward on a GPU replayed from CUDA graphs, one per bucket of batch shapes.

On an H200 a MiniLM pass of up to 23,000 tokens took 3.1-4.0 ms of wall time for 0.2-2.7 ms of
kernels: its ~85 kernels, each launched from Python, ran the pass, not the GPU. Replayed from a
graph (with the pooling, below), the same passes took 0.37 ms (1 text), 0.57 (16 texts), 1.40
(64 texts) and 3.93 (256 texts, where the kernels take 3.2), and a short query over HTTP 1.2-1.4
ms p50 instead of 4.4 (bench/results/gpu.md).

A graph has fixed shapes, so a batch is padded to its bucket: tokens (`token_bucket`),
sequences (a power of two) and the longest sequence (a power of two, which FlashAttention's grid
is sized by). The padding tokens form filler sequences of their own, each at most the bucket's
longest, so attention never mixes them with real tokens; their rows are dropped after the pass.

An embedding model's pooling (cls, mean, last token over every sequence) is captured too: it
is most of the calls left around a replay, and each call from the device thread waits for the
interpreter lock again, behind the event loop and the tokenizer threads.

Only models whose every layer attends through varlen_attn (FlashAttention on `cu_seqlens`) can
be captured: a layer on the SDPA path (a score bias, a key mask, a window varlen cannot do)
reads the batch's length groups on the host, which a graph would freeze. Such a model's first
capture fails, and it runs eagerly from then on, with a log line saying why. A replay has no
preemption points (`backends/preemption.py`): a waiting query waits for the whole pass, which on
a GPU takes milliseconds.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vectorpress.backends.common.buckets import octave_bucket
from vectorpress.backends.common.sequences import LengthGroup, PackedSequences
from vectorpress.backends.preemption import installed

log = logging.getLogger(__name__)

Encoder = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PackedSequences], torch.Tensor]

# Graphs kept at once, and the device memory their own buffers may hold together; the least
# recently used goes first. Each keeps its inputs and outputs (a bucket's tokens times the
# hidden size: 16 MB for MiniLM's largest bucket in float16, 168 MB for a 4,096-wide decoder's);
# the activations in between share one memory pool.
MAX_GRAPHS = 64
MAX_GRAPH_BYTES = 1 << 30
MIN_TOKENS = 64
MIN_LONGEST = 16
# Token buckets: multiples of MIN_TOKENS to 256, then four per power of two (at most 1/4,
# about 12% on average, of padding rows in a larger pass).
_STEPS_PER_OCTAVE = 4


def token_bucket(tokens: int) -> int:
    """The token count a pass of `tokens` runs at."""
    return octave_bucket(tokens, _STEPS_PER_OCTAVE, MIN_TOKENS)


def _pow2(n: int, least: int) -> int:
    return max(least, 1 << (max(n, 1) - 1).bit_length())


@dataclass(frozen=True)
class Shape:
    """A graph's bucket: tokens, sequences and the longest sequence's length."""

    tokens: int
    sequences: int
    longest: int


def shape_for(lengths: list[int]) -> tuple[Shape, list[int]]:
    """The bucket of a batch of sequences of `lengths`, and the lengths of the filler
    sequences that make it up: at least one, each of 1 to `shape.longest` tokens."""
    total, count = sum(lengths), len(lengths)
    longest = _pow2(max(lengths), MIN_LONGEST)
    tokens = token_bucket(total + 1)
    while True:
        spare = tokens - total
        # Enough fillers to hold the spare tokens, none longer than `longest`...
        sequences = _pow2(count + -(-spare // longest), 4)
        fillers = sequences - count
        # ...and each needs a token of its own.
        if fillers <= spare:
            break
        tokens = token_bucket(total + fillers)
    base, extra = divmod(spare, fillers)
    return Shape(tokens, sequences, longest), [base + 1] * extra + [base] * (fillers - extra)


class NotCapturable(RuntimeError):
    """The forward needs something of the batch on the host: it cannot run from a graph."""


class _GraphSequences(PackedSequences):
    """The captured batch's bounds: `cu_seqlens` is the graph's input buffer; what lives on
    the host is the bucket's, not any replayed batch's, so attention may not group by it."""

    @functools.cached_property
    def groups(self) -> list[LengthGroup]:
        raise NotCapturable("a layer groups the batch's sequences by length on the host")


#: The poolings `pool_all` does (SPLADE's runs eagerly, on the graph's hidden states).
POOLED_IN_GRAPHS = ("cls", "mean", "last_token")


def pool_all(hidden: torch.Tensor, bounds: torch.Tensor, method: str) -> torch.Tensor:
    """`backends.common.pooling.pool` over every sequence, from the bounds on the device alone
    (no host values, so that a graph can hold it); in the hidden states' dtype, as `pool`."""
    starts, ends = bounds[:-1].long(), bounds[1:].long()
    if method == "cls":
        return hidden[starts]
    if method == "last_token":
        return hidden[ends - 1]
    if method != "mean":
        raise ValueError(f"unknown pooling {method}")
    tokens = torch.arange(hidden.shape[0], device=hidden.device)
    sequence = torch.searchsorted(ends, tokens, right=True)
    sums = torch.zeros(len(ends), hidden.shape[1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, sequence, hidden.float())
    return sums.div_((ends - starts).unsqueeze(1)).to(hidden.dtype)


@dataclass(frozen=True)
class Replayed:
    """A replay's outputs, views of the graph's buffers: valid until the next replay."""

    hidden: torch.Tensor
    """(tokens, hidden): the batch's last hidden states."""
    pooled: torch.Tensor | None
    """(sequences, hidden): each sequence pooled, where the graphs pool."""


class _Graph:
    def __init__(
        self,
        encoder: Encoder,
        shape: Shape,
        device: torch.device,
        pool: Any,
        pooling: str | None,
    ) -> None:
        t, s = shape.tokens, shape.sequences
        # One input buffer, so that a replay needs one copy to the device: ids, token types,
        # positions (t each), then the sequence bounds (s + 1).
        # Warm-up and capture run on bounds the bucket allows (t <= s * longest), each
        # sequence 1 to `longest` tokens; a replay brings its own.
        base, extra = divmod(t, s)
        host = np.zeros(3 * t + s + 1, dtype=np.int64)
        np.cumsum([base + 1] * extra + [base] * (s - extra), out=host[3 * t + 1 :])
        self.inputs = torch.from_numpy(host).to(device)
        ids, types, positions = (self.inputs[i * t : (i + 1) * t] for i in range(3))
        seqs = _GraphSequences(torch.from_numpy(host[3 * t :]), shape.longest, varlen=True)
        # varlen_attn reads int32 bounds: the graph casts the replayed ones into this buffer.
        self.bounds = self.inputs[3 * t :].to(torch.int32)
        seqs.cu_seqlens = self.bounds
        self.graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        # Warmed up off the capture first (the library handles and kernels of new shapes), as
        # the CUDA graph documentation asks; no preemption point may run other work in there.
        with installed(lambda: None):
            with torch.cuda.stream(stream):
                hidden = encoder(ids, types, positions, seqs)
                if pooling is not None:
                    pool_all(hidden, self.bounds, pooling)
            torch.cuda.current_stream(device).wait_stream(stream)
            with torch.cuda.graph(self.graph, pool=pool):
                self.bounds.copy_(self.inputs[3 * t :])
                self.output = encoder(ids, types, positions, seqs)
                self.pooled = (
                    None if pooling is None else pool_all(self.output, self.bounds, pooling)
                )
        kept = [self.inputs, self.bounds, self.output]
        kept += [] if self.pooled is None else [self.pooled]
        self.bytes = sum(t.numel() * t.element_size() for t in kept)


class CudaGraphs:
    """Runs an encoder's forward from graphs, captured on first use of each bucket."""

    def __init__(
        self,
        encoder: Encoder,
        device: str,
        limit: int,
        pooling: str | None = None,
        max_graphs: int = MAX_GRAPHS,
        max_bytes: int = MAX_GRAPH_BYTES,
    ):
        """`limit`: the longest sequence the model takes; a longer one runs eagerly. `pooling`:
        what the graphs pool every sequence by (`pool_all`), if anything."""
        self.encoder = encoder
        self.pooling = pooling
        self.device = torch.device(device)
        self.limit = limit
        self.max_graphs = max_graphs
        self.max_bytes = max_bytes
        self.pool = torch.cuda.graph_pool_handle()
        self.graphs: OrderedDict[Shape, _Graph] = OrderedDict()
        self.off: str | None = None
        """Why graphs are off for this model (None: on)."""

    def __call__(
        self,
        input_ids: np.ndarray,
        token_type_ids: np.ndarray,
        position_ids: np.ndarray,
        lengths: list[int],
    ) -> Replayed | None:
        """The batch's outputs, or None where it must run eagerly."""
        if self.off is not None or not lengths or max(lengths) > self.limit:
            return None
        shape, fillers = shape_for(lengths)
        graph = self._graph(shape)
        if graph is None:
            return None
        t, total = shape.tokens, len(input_ids)
        host = np.zeros(3 * t + shape.sequences + 1, dtype=np.int64)
        host[:total] = input_ids
        host[t : t + total] = token_type_ids
        host[2 * t : 2 * t + total] = position_ids
        np.cumsum(lengths + fillers, out=host[3 * t + 1 :])
        graph.inputs.copy_(torch.from_numpy(host), non_blocking=True)
        graph.graph.replay()
        pooled = None if graph.pooled is None else graph.pooled[: len(lengths)]
        return Replayed(graph.output[:total], pooled)

    def _graph(self, shape: Shape) -> _Graph | None:
        graph = self.graphs.get(shape)
        if graph is not None:
            self.graphs.move_to_end(shape)
            return graph
        try:
            graph = _Graph(self.encoder, shape, self.device, self.pool, self.pooling)
        except NotCapturable as exc:
            self.off = str(exc)
        except RuntimeError as exc:  # the forward synchronizes, or the capture fails otherwise
            self.off = f"capture failed: {exc}"
        if graph is None:
            log.warning("CUDA graphs off for this model (%s): it runs eagerly", self.off)
            torch.cuda.synchronize(self.device)
            return None
        self.graphs[shape] = graph
        # The newest stays, whatever its size.
        while len(self.graphs) > 1 and (
            len(self.graphs) > self.max_graphs
            or sum(g.bytes for g in self.graphs.values()) > self.max_bytes
        ):
            self.graphs.popitem(last=False)
        return graph
