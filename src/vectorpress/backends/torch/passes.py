"""How a packed batch runs on the CPU: cut into cache-sized passes, each on the thread count
that is measured to be faster for it."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from vectorpress.backends.torch.attention import PackedSequences
from vectorpress.backends.torch.layers import onednn_linears

# Real tokens per encoder pass on the CPU. Measured on all-MiniLM-L6-v2 (2-core AMD EPYC,
# packed fp32, oneDNN linear): 4,096-token passes run 1.2-2x the tokens/s of 16,384-token
# ones, and 2,048 about 0.75-0.85x of 4,096: a pass's activations then stay in the caches.
# The queue's --max-batch-tokens keeps TEI's default (16384) and its meaning (what one batch
# may hold); the CPU backend runs such a batch as several passes of this size.
CPU_PASS_TOKENS = 4096

# Passes below this many tokens have GEMMs too small to split well, and their best thread
# count depends on what else runs on the machine (see ThreadChooser).
SMALL_PASS_TOKENS = 64

# oneDNN builds and keeps a primitive, with its JIT-compiled kernel, for every GEMM shape it
# meets, and packed passes have a new row count nearly every time: resident memory grew by
# about 2 MiB a batch under mixed traffic (bench/soak.py; F.linear stayed flat). Passes of
# SMALL_PASS_TOKENS or more are therefore padded with a filler sequence up to one of 8 sizes
# per power of two: about 40 shapes up to 4,096 tokens (plus the 63 small ones, run as they
# are), for at most 1/8 (about 4% averaged over every size) of extra rows.
_ROW_STEPS_PER_OCTAVE = 8


def bucket_rows(rows: int) -> int:
    """The row count a CPU pass of `rows` real tokens runs at."""
    if rows < SMALL_PASS_TOKENS:
        return rows
    step = (1 << (rows.bit_length() - 1)) // _ROW_STEPS_PER_OCTAVE
    return -(-rows // step) * step


Encoder = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PackedSequences], torch.Tensor]


@dataclass(frozen=True)
class PassSlice:
    start: int
    end: int
    seqs: PackedSequences


def cpu_passes(seqs: PackedSequences, max_tokens: int = CPU_PASS_TOKENS) -> list[PassSlice]:
    """Cut a packed batch at sequence bounds into passes of at most `max_tokens` (a longer
    single sequence gets a pass of its own)."""
    out: list[PassSlice] = []

    def cut(a: int, b: int) -> None:
        start = seqs.starts[a]
        end = seqs.starts[b] if b < seqs.size else seqs.total
        cu = seqs.cu_seqlens[a : b + 1] - start
        out.append(PassSlice(start, end, PackedSequences(cu, max(seqs.lengths[a:b]))))

    first, used = 0, 0
    for i, n in enumerate(seqs.lengths):
        if i > first and used + n > max_tokens:
            cut(first, i)
            first, used = i, 0
        used += n
    if seqs.size:
        cut(first, seqs.size)
    return out


@contextmanager
def num_threads(n: int) -> Iterator[None]:
    """Run the block on `n` intra-op threads, then restore the caller's count, so that nothing
    else in the process (another model, a reference encoder) is affected."""
    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


class ThreadChooser:
    """Intra-op threads for small passes, chosen by timing both candidates as they run.

    On an idle 2-core machine two threads run a 16-token query about 1.5x faster than one; when
    other processes hold the cores, each GEMM's barrier waits for a thread that is not
    scheduled, and two threads ran a 14-token query 10x slower than one (900 ms against 90).
    Neither count is right everywhere, so small passes keep the faster one by measurement and
    try the other every `probe_every` small passes, half as often after each losing try, in
    case the load has changed. Larger passes always use every thread: their GEMMs split well.
    """

    def __init__(
        self, small: int = SMALL_PASS_TOKENS, probe_every: int = 16, max_probe_every: int = 512
    ) -> None:
        self.small = small
        self.base_every = probe_every
        self.max_every = max_probe_every
        self.every = probe_every
        self.cost: dict[int, float] = {}
        """Seconds per small pass (normalized by size), by thread count."""
        self.best: int | None = None
        self._since_probe = 0

    @staticmethod
    def _normalized(tokens: int, seconds: float) -> float:
        # A small pass's time is mostly streaming the weights, then grows with its tokens.
        return seconds / (tokens + SMALL_PASS_TOKENS)

    def choose(self, tokens: int, available: int) -> int:
        if tokens >= self.small or available == 1:
            return available
        candidates = (1, available)
        unmeasured = [n for n in candidates if n not in self.cost]
        if unmeasured:
            return unmeasured[0]
        best = self.best if self.best in candidates else min(candidates, key=self.cost.__getitem__)
        self._since_probe += 1
        if self._since_probe >= self.every:
            self._since_probe = 0
            return available if best == 1 else 1
        return best

    def record(self, threads: int, tokens: int, seconds: float) -> None:
        if tokens >= self.small:
            return
        cost = self._normalized(tokens, seconds)
        previous = self.cost.get(threads)
        if threads == self.best and previous is not None:
            # The running choice is measured all the time: smooth out one slow pass.
            self.cost[threads] = previous + 0.25 * (cost - previous)
        else:
            # A probe is rare: take it as it is, or a changed load would need many probes.
            self.cost[threads] = cost
        if len(self.cost) < 2:
            return
        winner = min(self.cost, key=self.cost.__getitem__)
        if threads != self.best and self.best is not None:
            self.every = (
                self.base_every if winner == threads else min(2 * self.every, self.max_every)
            )
        self.best = winner


@dataclass(frozen=True)
class LinearKernels:
    """Whether passes run their linear layers on oneDNN, by pass size (see SMALL_PASS_TOKENS)."""

    small: bool
    large: bool


def pick_linear_kernels(
    encoder: nn.Module, position_offset: int, *, repeats: int = 3, margin: float = 0.05
) -> LinearKernels:
    """Time the model's own forward on F.linear and on oneDNN, for a short query and for a
    mid-sized pass, and keep the faster of each (oneDNN must win by `margin`).

    oneDNN on weights reordered once beats MKL's sgemm behind F.linear by up to 2x on CPUs with
    AVX-512 (MKL takes generic kernels on AMD ones). On an AVX2-only AMD EPYC it ran a 16-token
    query about 1.3x faster, but larger passes no faster, and there its primitives for every
    new row count cost resident memory (see `bucket_rows`).
    """
    fuse = getattr(encoder, "fuse", None)
    if fuse is None:
        return LinearKernels(False, False)
    fuse(True)

    def timed(lengths: list[int], onednn: bool) -> float:
        ids = torch.zeros(sum(lengths), dtype=torch.long)
        positions = torch.cat([torch.arange(n) for n in lengths]) + position_offset
        bounds = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        seqs = PackedSequences(bounds, max(lengths))
        times = []
        with torch.inference_mode(), onednn_linears(onednn):
            for _ in range(repeats + 1):  # the first run builds kernels: not counted
                started = time.perf_counter()
                encoder(ids, ids, positions, seqs)
                times.append(time.perf_counter() - started)
        return min(times[1:])

    def faster(lengths: list[int]) -> bool:
        return timed(lengths, True) < (1 - margin) * timed(lengths, False)

    return LinearKernels(small=faster([16]), large=faster([64] * 4))


class CpuPasses:
    """Runs an encoder over a packed batch pass by pass (see CPU_PASS_TOKENS)."""

    def __init__(
        self,
        max_tokens: int = CPU_PASS_TOKENS,
        kernels: LinearKernels = LinearKernels(small=True, large=True),
    ) -> None:
        self.max_tokens = max_tokens
        self.kernels = kernels
        self.threads = ThreadChooser()

    def run(
        self,
        encoder: Encoder,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        if seqs.total <= self.max_tokens:
            return self._one(encoder, input_ids, token_type_ids, position_ids, seqs)
        return torch.cat(
            [
                self._one(
                    encoder,
                    input_ids[p.start : p.end],
                    token_type_ids[p.start : p.end],
                    position_ids[p.start : p.end],
                    p.seqs,
                )
                for p in cpu_passes(seqs, self.max_tokens)
            ]
        )

    def _one(
        self,
        encoder: Encoder,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        tokens = seqs.total
        onednn = self.kernels.small if tokens < SMALL_PASS_TOKENS else self.kernels.large
        # Only oneDNN keeps something per shape.
        rows = bucket_rows(tokens) if onednn else tokens
        if rows > tokens:
            # The filler is a sequence of its own: attention never mixes it with real tokens,
            # and its rows are dropped below.
            pad = rows - tokens
            input_ids, token_type_ids, position_ids = (
                torch.cat([t, t.new_zeros(pad)]) for t in (input_ids, token_type_ids, position_ids)
            )
            seqs = PackedSequences(
                torch.cat([seqs.cu_seqlens, seqs.cu_seqlens.new_tensor([rows])]),
                max(seqs.max_seqlen, pad),
                seqs.varlen,
            )
        threads = self.threads.choose(tokens, torch.get_num_threads())
        started = time.perf_counter()
        with num_threads(threads), onednn_linears(onednn):
            out = encoder(input_ids, token_type_ids, position_ids, seqs)
        self.threads.record(threads, tokens, time.perf_counter() - started)
        return out if rows == tokens else out[:tokens]
