"""Units side by side on the scheduler's runners (`--device-runners`), on real weights: two
units that wait run at once, each on one intra-op thread; a lone one runs on every thread; a
backend that cannot share the device never gets a second runner; faults and preemption stay
per unit.

Concurrency is shown, never timed: two batches that must run at once meet at a barrier (which
breaks, failing the test, if one of them waits for the other to end).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers.passes import fixed_pass_plan
from tests.helpers.trims import recording_trimmer
from tests.helpers.waiting import until
from vectorpress.backends.base import Backend
from vectorpress.backends.select import select_backend
from vectorpress.core import scheduler as scheduler_module
from vectorpress.core.heap import HeapTrimmer
from vectorpress.core.infer import Infer
from vectorpress.core.scheduler import Scheduler
from vectorpress.model_spec import ModelSpec, load_model_spec
from vectorpress.server import build_pipeline, device_runners
from vectorpress.settings import ModelSettings, ServerSettings
from vectorpress.types import Batch, BatchOutput

PASSAGE = " ".join(["water"] * 25)  # 28 tokens with [CLS], [SEP] and `bulk_texts`' number
QUERY = "a short query"
# Six passages (168 tokens) make one bulk unit under this budget, a seventh would not fit.
UNIT_TOKENS = 170
MEET_S = 30.0

pytestmark = pytest.mark.skipif(
    torch.get_num_threads() < 2, reason="runners share two or more intra-op threads"
)


class Watched:
    """Delegates to a real backend; records each batch's thread, intra-op thread count and
    size, and, with `meet`, holds each batch at a barrier until the other party arrives."""

    def __init__(self, inner: Backend, concurrent: bool = True) -> None:
        self.inner = inner
        self.name = inner.name
        self.dtype = inner.dtype
        self.device = inner.device
        self.is_padded = inner.is_padded
        self.max_batch_size = inner.max_batch_size
        self.concurrent_passes = concurrent
        self.calls: list[tuple[str, int, int]] = []
        self.events: list[tuple[str, int, str]] = []
        self.meet: threading.Barrier | None = None
        self.gate: threading.Event | None = None
        self.gate_thread: str | None = None
        """Only batches on the thread of this name wait at `gate` (None: all)."""
        self.fail_next = False
        self._lock = threading.Lock()

    def embed(self, batch: Batch) -> BatchOutput:
        thread = threading.current_thread().name
        with self._lock:
            index = len(self.calls)
            self.calls.append((thread, torch.get_num_threads(), batch.size))
            self.events.append(("start", index, thread))
        if self.meet is not None and batch.size > 1:
            self.meet.wait(MEET_S)
        if self.gate is not None and batch.size > 1 and self.gate_thread in (None, thread):
            self.gate.wait(MEET_S)
        with self._lock:
            fail, self.fail_next = self.fail_next, False
        if fail:
            raise RuntimeError("injected fault")
        out = self.inner.embed(batch)
        with self._lock:
            self.events.append(("end", index, thread))
        return out

    def predict(self, batch: Batch) -> BatchOutput:
        return self.inner.predict(batch)

    def health(self) -> None:
        self.inner.health()


@pytest.fixture(scope="module")
def loaded(minilm: Path) -> tuple[ModelSpec, Backend]:
    settings = ModelSettings(str(minilm))
    spec = load_model_spec(minilm, settings)
    with fixed_pass_plan():
        return spec, select_backend(spec, settings)


class Rig:
    def __init__(
        self,
        minilm: Path,
        loaded: tuple[ModelSpec, Backend],
        runners: int,
        trimmer: HeapTrimmer | None = None,
    ) -> None:
        self.minilm = minilm
        self.spec, self.inner = loaded
        self.scheduler = Scheduler(runners=runners, trimmer=trimmer)
        self.infers: list[Infer] = []

    def add(self, concurrent: bool = True, **settings: object) -> tuple[Infer, Watched]:
        values: dict[str, object] = {"bulk_pass_tokens": UNIT_TOKENS, "tokenization_workers": 1}
        values.update(settings)
        backend = Watched(self.inner, concurrent)
        ms = ModelSettings(str(self.minilm), **values)  # type: ignore[arg-type]
        infer = build_pipeline(ServerSettings(), ms, self.spec, backend, scheduler=self.scheduler)
        self.infers.append(infer)
        return infer, backend

    def hold(self) -> threading.Event:
        """Hold the device thread in a call (every runner waits behind it) until set."""
        release = threading.Event()
        held = threading.Event()

        def wait() -> None:
            held.set()
            release.wait(MEET_S)

        threading.Thread(target=self.scheduler.call, args=(wait,), daemon=True).start()
        assert held.wait(MEET_S)
        return release

    def close(self) -> None:
        for infer in self.infers:
            infer.worker.stop()
            infer.tokenizers.close()
        self.scheduler.stop()


@pytest.fixture
def rig(minilm: Path, loaded: tuple[ModelSpec, Backend]) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(runners: int = 2, trimmer: HeapTrimmer | None = None) -> Rig:
        made.append(Rig(minilm, loaded, runners, trimmer))
        return made[-1]

    yield make
    for r in made:
        r.close()


def bulk_texts(n: int) -> list[str]:
    return [f"{PASSAGE} {i}" for i in range(n)]


# Two bulk requests of one unit each.
TWO_REQUESTS = (bulk_texts(6), bulk_texts(12)[6:])


async def queued_while_held(r: Rig, infer: Infer, *requests: list[str]) -> list[Any]:
    """Bulk requests of these texts, all queued while the device thread is held (so the
    scheduler alone decides who runs what), then released: their tasks."""
    release = r.hold()
    tasks = [asyncio.ensure_future(infer.embed(texts, priority="bulk")) for texts in requests]
    await until(lambda: len(infer.queue) == sum(map(len, requests)))
    release.set()
    return tasks


def test_waiting_units_run_side_by_side_on_one_thread_each(rig: Callable[[int], Rig]) -> None:
    r = rig(2)
    infer, backend = r.add()
    backend.meet = threading.Barrier(2)
    one, two = TWO_REQUESTS

    async def scenario() -> tuple[list[np.ndarray], list[np.ndarray]]:
        ra, rb = await asyncio.gather(*await queued_while_held(r, infer, one, two))
        return ra.values, rb.values

    va, vb = asyncio.run(scenario())
    threads = {name for name, _, _ in backend.calls}
    assert len(threads) == 2, backend.calls  # the device thread and a helper
    assert [n for _, n, _ in backend.calls] == [1, 1]
    assert not backend.meet.broken

    # The same vectors as one runner gives, on every thread.
    alone = rig(1)
    infer1, backend1 = alone.add()

    async def reference() -> list[np.ndarray]:
        return (await infer1.embed(one + two, priority="bulk")).values

    expected = asyncio.run(reference())
    assert {n for _, n, _ in backend1.calls} == {torch.get_num_threads()}
    np.testing.assert_allclose(np.stack(va + vb), np.stack(expected), rtol=0, atol=1e-6)


def test_a_lone_unit_runs_on_every_thread(rig: Callable[[int], Rig]) -> None:
    r = rig(2)
    infer, backend = r.add()

    async def scenario() -> None:
        await infer.embed(bulk_texts(6), priority="bulk")
        await infer.embed([QUERY])

    asyncio.run(scenario())
    assert [n for _, n, _ in backend.calls] == [torch.get_num_threads()] * 2
    assert len({name for name, _, _ in backend.calls}) == 1


def test_waiting_requests_are_shared_out_among_idle_runners(rig: Callable[..., Rig]) -> None:
    r = rig(2)
    # Two requests of ten passages (560 tokens together, over SPLIT_MIN_TOKENS) in units of up
    # to 4,096 tokens: one unit with one runner, two halves side by side with two.
    infer, backend = r.add(bulk_pass_tokens=4096)
    backend.meet = threading.Barrier(2)
    texts = bulk_texts(20)
    assert scheduler_module.SPLIT_MIN_TOKENS <= 20 * 28

    async def scenario() -> None:
        await asyncio.gather(*await queued_while_held(r, infer, texts[:10], texts[10:]))

    asyncio.run(scenario())
    assert sorted(size for _, _, size in backend.calls) == [10, 10]
    assert [n for _, n, _ in backend.calls] == [1, 1]


def test_one_request_alone_runs_whole_on_every_thread(rig: Callable[..., Rig]) -> None:
    r = rig(2)
    infer, backend = r.add(bulk_pass_tokens=4096)
    texts = bulk_texts(20)

    async def scenario() -> None:
        await asyncio.gather(*await queued_while_held(r, infer, texts))

    asyncio.run(scenario())
    assert backend.calls == [("vp-backend", torch.get_num_threads(), 20)]


def test_a_backend_that_cannot_share_the_device_gets_no_second_runner(
    rig: Callable[[int], Rig],
) -> None:
    r = rig(2)
    infer, backend = r.add(concurrent=False)

    async def scenario() -> None:
        await asyncio.gather(*await queued_while_held(r, infer, *TWO_REQUESTS))

    asyncio.run(scenario())
    assert r.scheduler._helpers == []
    assert len({name for name, _, _ in backend.calls}) == 1
    assert [n for _, n, _ in backend.calls] == [torch.get_num_threads()] * 2
    # One after the other.
    assert [e[:2] for e in backend.events] == [("start", 0), ("end", 0), ("start", 1), ("end", 1)]


def test_a_failing_unit_on_one_runner_fails_only_its_request(rig: Callable[[int], Rig]) -> None:
    r = rig(2)
    infer, backend = r.add()
    backend.meet = threading.Barrier(2)
    backend.fail_next = True  # whichever unit gets there first

    async def scenario() -> tuple[list[BaseException | int], int]:
        requests = await queued_while_held(r, infer, *TWO_REQUESTS)
        results = await asyncio.gather(*requests, return_exceptions=True)
        backend.meet = None
        after = await infer.embed(bulk_texts(3), priority="bulk")
        return [x if isinstance(x, BaseException) else len(x.values) for x in results], len(
            after.values
        )

    results, after = asyncio.run(scenario())
    errors = [x for x in results if isinstance(x, BaseException)]
    assert len(errors) == 1 and "injected fault" in str(errors[0])
    assert 6 in results and after == 3
    assert len({name for name, _, _ in backend.calls[:2]}) == 2


def test_a_query_runs_inside_a_side_by_side_bulk_unit(rig: Callable[[int], Rig]) -> None:
    r = rig(2)
    infer, backend = r.add()
    backend.meet = threading.Barrier(2)
    backend.gate = threading.Event()

    async def scenario() -> None:
        bulks = await queued_while_held(r, infer, *TWO_REQUESTS)
        # Both runners hold a bulk unit at the gate: the query can only run inside one.
        await until(lambda: len(backend.calls) == 2)
        query = asyncio.ensure_future(infer.embed([QUERY]))
        await until(lambda: len(infer.queue) == 1)
        backend.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(query, *bulks)

    asyncio.run(scenario())
    assert len(backend.calls) == 3
    thread, threads, size = backend.calls[2]
    assert size == 1 and threads == 1  # on the runner's own share
    starts = {i: n for n, (kind, i, _) in enumerate(backend.events) if kind == "start"}
    ends = {i: n for n, (kind, i, _) in enumerate(backend.events) if kind == "end"}
    host = next(i for i in (0, 1) if backend.calls[i][0] == thread)
    assert starts[host] < starts[2] < ends[2] < ends[host]


def test_the_heap_is_trimmed_only_once_every_runner_rests(rig: Callable[..., Rig]) -> None:
    trimmer, trims = recording_trimmer(rest_s=0.05)
    r = rig(2, trimmer)
    infer, backend = r.add()
    backend.meet = threading.Barrier(2)
    backend.gate, backend.gate_thread = threading.Event(), "vp-runner-1"

    async def scenario() -> None:
        bulks = await queued_while_held(r, infer, *TWO_REQUESTS)
        # The device thread's unit ends; the helper's waits at the gate.
        await until(lambda: any(kind == "end" for kind, _, _ in backend.events))
        before = len(trims)
        await asyncio.sleep(0.3)  # six rests of the device thread, the helper still busy
        assert len(trims) == before
        backend.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(*bulks)
        await until(lambda: len(trims) == before + 1)

    asyncio.run(scenario())
    assert len({name for name, _, _ in backend.calls}) == 2


def test_auto_is_two_runners_where_there_are_two_threads() -> None:
    threads = torch.get_num_threads()
    assert device_runners(ServerSettings()) == 2
    assert device_runners(ServerSettings(device_runners=1)) == 1
    # Never more runners than threads.
    assert device_runners(ServerSettings(device_runners=threads + 5)) == threads
