"""How a packed batch runs on the CPU: cut into cache-sized passes, each on the linear kernel
and the thread count that start-up timing planned for its size."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from vectorpress.backends.common.buckets import octave_bucket
from vectorpress.backends.common.sequences import PackedSequences
from vectorpress.backends.common.threads import num_threads
from vectorpress.backends.torch.cpu_kernels import NONE, CpuKernels, cpu_kernels
from vectorpress.backends.torch.layers import onednn_linears
from vectorpress.cpus import CpuSample

if TYPE_CHECKING:
    from vectorpress.backends.torch.blocks import FusedModel

log = logging.getLogger(__name__)

# Real tokens per encoder pass on the CPU. Measured on all-MiniLM-L6-v2 (2-core AMD EPYC,
# packed fp32, oneDNN linear): 4,096-token passes run 1.2-2x the tokens/s of 16,384-token
# ones, and 2,048 about 0.75-0.85x of 4,096: a pass's activations then stay in the caches.
# The queue's --max-batch-tokens keeps TEI's default (16384) and its meaning (what one batch
# may hold); the CPU backend runs such a batch as several passes of this size.
CPU_PASS_TOKENS = 4096

# Passes below this many tokens have GEMMs too small to split well: they get their own
# linear kernel and thread count (see plan_passes).
SMALL_PASS_TOKENS = 64

# oneDNN builds and keeps a primitive, with its JIT-compiled kernel, for every GEMM shape it
# meets, and packed passes have a new row count nearly every time: resident memory grew by
# about 2 MiB a batch in in-process probes (F.linear stayed flat). Even the 63 row counts of
# short passes cost about 110 MiB more than 4 and kept creeping (+14 MiB over 8,000 batches;
# a larger ONEDNN_PRIMITIVE_CACHE_CAPACITY did not change that). So every oneDNN pass is padded
# with a filler sequence to one of a few row counts. A short one: a multiple of 4 up to 32
# rows, where most queries fall, and of 16 above (10 shapes). On a Zen 4 with AVX-512 that
# padding is not free: against multiples of 16 everywhere (4 shapes), all-MiniLM-L6-v2 ran a
# 9-11-token query 8-11% faster in-process (12 rows against 16) and an 18-token one 17-21%
# (20 against 32), in float32 and bfloat16, for 14-18 MiB more resident memory, flat over
# 4,000 queries of every short length. (On the AVX2-only EPYC before it, multiples of 16 ran
# about 3% slower than exact rows.) A larger pass: one of 8 sizes per power of two (about 50
# shapes up to 4,096 tokens, at most 1/8, about 4% averaged over every size, of extra rows).
_FINE_ROWS = 32
_FINE_ROW_STEP = 4
_SMALL_ROW_STEP = 16
_ROW_STEPS_PER_OCTAVE = 8


def bucket_rows(rows: int) -> int:
    """The row count a oneDNN pass of `rows` real tokens runs at."""
    if rows <= _FINE_ROWS:
        step = _FINE_ROW_STEP
    elif rows < SMALL_PASS_TOKENS:
        step = _SMALL_ROW_STEP
    else:
        return octave_bucket(rows, _ROW_STEPS_PER_OCTAVE)
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
        keys = seqs.key_lengths[a:b] if seqs.key_lengths is not None else None
        out.append(
            PassSlice(start, end, PackedSequences(cu, max(seqs.lengths[a:b]), key_lengths=keys))
        )

    first, used = 0, 0
    for i, n in enumerate(seqs.lengths):
        if i > first and used + n > max_tokens:
            cut(first, i)
            first, used = i, 0
        used += n
    if seqs.size:
        cut(first, seqs.size)
    return out


@dataclass(frozen=True)
class PassPlan:
    """How CPU passes run, for short ones (under SMALL_PASS_TOKENS) and for the rest: on oneDNN
    or on F.linear; short ones also on how many intra-op threads (0: the caller's count; larger
    passes always take the caller's count, see plan_passes), or on the shortcut of that name
    when `small_shortcut` (the encoder's ONNX graph, `short_graph.py`, or the compiled kernel,
    `short_kernel.py`); larger passes on that shortcut too where `large_shortcut` (one that
    can run them, `Shortcut.larger`: the int8 kernel, `int8_kernel.py`)."""

    small_onednn: bool
    large_onednn: bool
    small_threads: int = 0
    small_shortcut: str = ""
    large_shortcut: bool = False


@dataclass(frozen=True)
class Shortcut:
    """Another way to run short passes, with the intra-op thread counts it may run on (0: the
    caller's count), and whether it can run larger passes too (on every thread)."""

    name: str
    run: Encoder
    threads: tuple[int, ...]
    larger: bool = False


# The encoder's ONNX graph runs on ONNX Runtime's threads; torch's one keeps the ops around it
# (pooling) from waking a second OpenMP thread that would spin on a core the graph's threads
# need.
GRAPH = "ONNX Runtime"
# The compiled kernel runs on torch's own OpenMP team.
KERNEL = "the compiled kernel"


def plan_passes(
    encoder: FusedModel,
    position_offset: int,
    *,
    shortcuts: tuple[Shortcut, ...] = (),
    kernels: CpuKernels = NONE,
    repeats: int = 3,
    budget: float = 0.3,
    margin: float = 0.05,
    fuse: bool = True,
    larger: tuple[int, ...] = (64,) * 4,
) -> PassPlan:
    """Time the model's own forward for a short query and for a mid-sized pass, on oneDNN and
    on F.linear (the short query also on one thread and on all, and on each of `shortcuts` at
    its thread counts), and keep the fastest of each (oneDNN and a shortcut must win by
    `margin`: they cost memory). Decided once, at start-up, so that an input gives the
    same vector every time: the thread count can change the last bits.

    Measured on 2-core AMD EPYCs: on an AVX2-only one, oneDNN on weights reordered once ran a
    16-token query about 1.3x faster than MKL's sgemm behind F.linear, larger passes no faster,
    and there its primitives for every new row count cost resident memory (see
    `bucket_rows`); on a Zen 4 with AVX-512 the two ran a 2,048 x 384 x 1,536 GEMM at 170-175
    GFLOP/s each, in float32 and, at 400-440, in bfloat16. Two threads run a short query 1.5x
    faster than one on an idle machine, but 10x slower when other processes hold the cores
    (each op's barrier waits for a thread that is not scheduled).

    A shortcut that can run larger passes (`Shortcut.larger`), kept for short ones, is timed
    on the larger pass too, on every thread, and kept for it where it wins there by `margin`.

    The ways a pass can run are timed in turn, a run of each per round, not one way's runs and
    then the next's: this machine's speed wanders by a fifth within a minute, and a bfloat16
    server of one benchmark run, its ways timed one after the other, kept its short passes on
    oneDNN on one thread where the compiled kernel, timed again, took 2.01 ms against 2.41.

    `fuse=False` times the encoder's linears as they are built (int8's: oneDNN's int8 GEMM or
    fbgemm's); `larger` is the sequence lengths of the larger pass timed; a negative `margin`
    keeps oneDNN unless it is slower by more than that share.
    """
    if fuse:
        encoder.fuse(True)
    available = torch.get_num_threads()

    def pass_of(lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor, PackedSequences]:
        ids = torch.zeros(sum(lengths), dtype=torch.long)
        positions = torch.cat([torch.arange(n) for n in lengths]) + position_offset
        bounds = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32)
        return ids, positions, PackedSequences(bounds, max(lengths))

    def raced(lengths: list[int], ways: list[_Way]) -> list[float]:
        """Each way's best time for a pass of `lengths`, the ways run in turn: a first run
        each (it builds kernels: not counted), then rounds of one run each, so that the
        machine's speed, which can wander by a fifth within a minute, weighs on all of them
        alike. A way stops after `repeats` timed runs, or after two once its timed runs passed
        `budget` seconds (a large model's planning would otherwise hold its start-up for a
        minute)."""
        ids, positions, seqs = pass_of(lengths)
        times: list[list[float]] = [[] for _ in ways]

        def wants(took: list[float]) -> bool:
            return len(took) < repeats + 1 and (len(took) < 2 or sum(took[1:]) < budget)

        while any(wants(took) for took in times):
            for way, took in zip(ways, times, strict=True):
                if not wants(took):
                    continue
                # The native passes as they will run: on the compiled ops they call where
                # they fit.
                with (
                    torch.inference_mode(),
                    onednn_linears(way.onednn),
                    num_threads(way.threads or available),
                    cpu_kernels(kernels),
                ):
                    started = time.perf_counter()
                    (way.run or encoder)(ids, ids, positions, seqs)
                    took.append(time.perf_counter() - started)
        return [min(took[1:]) for took in times]

    def gemm(on_onednn: float, on_f_linear: float) -> tuple[bool, float]:
        onednn = on_onednn < (1 - margin) * on_f_linear
        return onednn, on_onednn if onednn else on_f_linear

    short = [16]
    native = [_Way(True), _Way(False)]
    if available > 1:
        native += [_Way(True, 1), _Way(False, 1)]
    offered = [
        (shortcut, threads)
        for shortcut in shortcuts
        for threads in shortcut.threads
        if threads <= available
    ]
    took = raced(short, native + [_Way(False, threads, s.run) for s, threads in offered])
    log.debug("a 16-token pass: %.2f ms on oneDNN, %.2f without", 1e3 * took[0], 1e3 * took[1])
    small_onednn, small_best = gemm(took[0], took[1])
    small_threads = 0
    if available > 1:
        one = took[2] if small_onednn else took[3]
        if one < small_best:
            small_threads, small_best = 1, one
    log.debug("a short pass natively: %.2f ms", 1e3 * small_best)
    chosen: Shortcut | None = None
    chosen_threads = 0
    # A shortcut keeps a second copy of the weights: it wins by the margin whichever way the
    # GEMMs' margin leans.
    bar = (1 - abs(margin)) * small_best
    for (shortcut, threads), on_it in zip(offered, took[len(native) :], strict=True):
        log.debug("a short pass on %s, %s threads: %.2f ms", shortcut.name, threads, 1e3 * on_it)
        if on_it < bar:
            chosen, chosen_threads, bar = shortcut, threads, on_it
    # Larger passes keep every thread: they split well, and a start-up that met other work on
    # the cores timed one thread faster and would have halved the throughput for good (seen
    # with bfloat16 while a test suite ran beside it).
    on_larger = chosen is not None and chosen.larger
    took = raced(
        list(larger), native[:2] + ([_Way(False, 0, chosen.run)] if chosen and on_larger else [])
    )
    log.debug(
        "a %d-token pass: %.2f ms on oneDNN, %.2f without",
        sum(larger),
        1e3 * took[0],
        1e3 * took[1],
    )
    large_onednn, large_best = gemm(took[0], took[1])
    if chosen is None:
        return PassPlan(small_onednn, large_onednn, small_threads)
    large_shortcut = False
    if on_larger:
        log.debug("a %d-token pass on %s: %.2f ms", sum(larger), chosen.name, 1e3 * took[2])
        large_shortcut = took[2] < (1 - abs(margin)) * large_best
    return PassPlan(False, large_onednn, chosen_threads, chosen.name, large_shortcut)


@dataclass(frozen=True)
class _Way:
    """One way start-up times a pass: on oneDNN or on F.linear, on `threads` intra-op threads
    (0: all), through the encoder or `run` (a shortcut)."""

    onednn: bool
    threads: int = 0
    run: Encoder | None = None


# Start-up's timings are taken again when other processes kept more than this share of the
# process's CPUs busy while they ran, up to PLAN_ATTEMPTS times, PLAN_PAUSE seconds apart. Two
# servers started together on the 2-core AVX2 EPYC timed their plans against each other: one
# kept its short passes off the ONNX graph, on one torch thread (where a pass does not wait at
# barriers for a thread another process holds), and answered a short query in 14-20 ms p50
# instead of 6.5-7.8 for as long as it ran. The random pause alone did not part two servers
# started together (each timed while the other did, four times): hence the lock below too.
PLAN_CONTENTION = 0.25
PLAN_ATTEMPTS = 4
PLAN_PAUSE = 1.0


# Servers of one machine time their plans one at a time, under this lock (a plan takes about a
# second; one that waits longer times anyway).
PLAN_LOCK = Path(tempfile.gettempdir()) / "vectorpress-cpu-plan.lock"
PLAN_LOCK_WAIT = 30.0


@contextlib.contextmanager
def planning_alone(path: Path = PLAN_LOCK, wait: float = PLAN_LOCK_WAIT) -> Iterator[bool]:
    """Hold the machine's planning lock (yields whether it was had: a lock file that cannot be
    opened, or a wait past `wait` seconds, plans without it; so does a system without flock)."""
    try:
        import fcntl

        fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    except (ImportError, OSError):
        yield False
        return
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    held = False
                    break
                time.sleep(0.02)
        yield held
    finally:
        os.close(fd)  # and with it the lock


def timed_against_others(plan: Callable[[], PassPlan]) -> tuple[PassPlan, float | None]:
    """`plan()`, timed alone among this machine's servers (`planning_alone`), and the share of
    the process's CPUs other processes kept busy meanwhile (None where the system cannot
    tell)."""
    with planning_alone():
        before = CpuSample.now()
        planned = plan()
        after = CpuSample.now()
    if before is None or after is None:
        return planned, None
    return planned, after.others_since(before)


def plan_when_quiet(
    plan: Callable[[], PassPlan],
    *,
    attempts: int = PLAN_ATTEMPTS,
    pause: float = PLAN_PAUSE,
    measure: Callable[[Callable[[], PassPlan]], tuple[PassPlan, float | None]] = (
        timed_against_others
    ),
) -> PassPlan:
    """`plan()` (a `plan_passes`), timed again while other processes keep the CPUs busy: a
    plan is kept for the server's life, so one timed under another process's load serves
    every later request on the kernels that load favoured. After `attempts`, the last plan
    stands, with a warning."""
    planned, others = measure(plan)
    for _ in range(attempts - 1):
        if others is None or others <= PLAN_CONTENTION:
            return planned
        # Servers started together plan together: a random wait parts them.
        wait = pause * random.uniform(0.5, 1.5)
        log.info(
            "CPU passes timed while other processes held %.0f%% of this process's CPUs: "
            "timing them again in %.1f s",
            100 * others,
            wait,
        )
        time.sleep(wait)
        planned, others = measure(plan)
    if others is not None and others > PLAN_CONTENTION:
        log.warning(
            "CPU passes timed while other processes held %.0f%% of this process's CPUs, on "
            "every one of %d tries: the plan may not be the fastest once they are done",
            100 * others,
            attempts,
        )
    return planned


class CpuPasses:
    """Runs an encoder over a packed batch pass by pass (see CPU_PASS_TOKENS)."""

    def __init__(
        self,
        max_tokens: int = CPU_PASS_TOKENS,
        plan: PassPlan = PassPlan(True, True),
        longest_first: bool = True,
        shortcut: Encoder | None = None,
        kernels: CpuKernels = NONE,
    ) -> None:
        self.max_tokens = max_tokens
        self.plan = plan
        # Where the plan runs short passes, or every pass, on a shortcut (`PassPlan`).
        self.shortcut = shortcut if plan.small_shortcut else None
        # Sort a batch's sequences by length before cutting it (see
        # PackedSequences.longest_first); False runs them in arrival order (the reference).
        self.longest_first = longest_first
        # Compiled ops the passes call where they fit (`f32_kernels.py`, `bf16_kernels.py`).
        self.kernels = kernels
        # The intra-op threads `max_tokens` is for: those of the thread that loads the model.
        self.full_threads = torch.get_num_threads()

    def pass_tokens(self) -> int:
        """The most tokens of a pass on this thread's intra-op threads: `max_tokens` shared
        out when it has fewer than the model was loaded with (a unit beside another on the
        scheduler's runners). Measured on the Zen 5 (all-MiniLM-L6-v2, the corpus in units of
        4,096 tokens, two threads each running units on one intra-op thread, three alternated
        rounds): passes of 2,048 tokens ran 1.03x the tokens/s of 4,096 in float32 and 1.08x
        in bfloat16 (where 4,096-token passes ran 0.95x one unit at a time on both threads);
        1,024 level with 2,048."""
        threads = torch.get_num_threads()
        if threads >= self.full_threads:
            return self.max_tokens
        return max(1, self.max_tokens * threads // self.full_threads)

    def threads(self, tokens: int) -> int:
        """The intra-op threads a pass of `tokens` real tokens runs on."""
        small = tokens < SMALL_PASS_TOKENS
        return (self.plan.small_threads if small else 0) or torch.get_num_threads()

    def run(
        self,
        encoder: Encoder,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        """The last hidden states of `seqs`' tokens, in their order."""
        sorted_ = seqs.longest_first() if self.longest_first else None
        if sorted_ is None:
            return self._passes(encoder, input_ids, token_type_ids, position_ids, seqs)
        tokens, by_length = sorted_
        out = self._passes(
            encoder,
            input_ids[tokens],
            token_type_ids[tokens],
            position_ids[tokens],
            by_length,
        )
        back = torch.empty_like(tokens)
        back[tokens] = torch.arange(len(tokens), device=tokens.device)
        return out.index_select(0, back)

    def _passes(
        self,
        encoder: Encoder,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        size = self.pass_tokens()
        cuts = [PassSlice(0, seqs.total, seqs)] if seqs.total <= size else cpu_passes(seqs, size)
        outs = [
            self._one(
                encoder,
                input_ids[p.start : p.end],
                token_type_ids[p.start : p.end],
                position_ids[p.start : p.end],
                p.seqs,
            )
            for p in cuts
        ]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _one(
        self,
        encoder: Encoder,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seqs: PackedSequences,
    ) -> torch.Tensor:
        tokens = seqs.total
        small = tokens < SMALL_PASS_TOKENS
        on_shortcut = small or self.plan.large_shortcut
        # A ColBERT query holds keys out of attention, which the shortcuts cannot say.
        if on_shortcut and self.shortcut is not None and seqs.key_lengths is None:
            with num_threads(self.threads(tokens)):
                return self.shortcut(input_ids, token_type_ids, position_ids, seqs)
        plan = self.plan
        onednn = plan.small_onednn if small else plan.large_onednn
        # Only oneDNN keeps something per shape.
        rows = bucket_rows(tokens) if onednn else tokens
        if rows > tokens:
            # The filler's rows are dropped below.
            pad = rows - tokens
            input_ids, token_type_ids, position_ids = (
                torch.cat([t, t.new_zeros(pad)]) for t in (input_ids, token_type_ids, position_ids)
            )
            seqs = seqs.with_filler(rows)
        threads = self.threads(tokens)
        with num_threads(threads), onednn_linears(onednn), cpu_kernels(self.kernels):
            out = encoder(input_ids, token_type_ids, position_ids, seqs)
        return out if rows == tokens else out[:tokens]
