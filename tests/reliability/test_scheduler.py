"""The scheduler on real weights: lanes, fair share across models, preemption between layers, and
faults that fail one batch only.

Every test holds the device thread on a gate (the first forward waits for an event the test
sets) while it queues the work whose order it checks, so the order is decided by the scheduler
alone: no timing is asserted.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tests.helpers.faulty import FaultyBackend
from tests.helpers.passes import fixed_pass_plan
from tests.helpers.trims import recording_trimmer
from tests.helpers.waiting import until
from vectorpress.backends.base import Backend
from vectorpress.backends.select import select_backend
from vectorpress.core.heap import HeapTrimmer
from vectorpress.core.infer import Infer
from vectorpress.core.queue import Lane
from vectorpress.core.scheduler import Scheduler
from vectorpress.errors import BackendError, UnhealthyError
from vectorpress.model_spec import ModelSpec, load_model_spec
from vectorpress.server import build_pipeline
from vectorpress.settings import ModelSettings, ServerSettings
from vectorpress.types import Batch, Encoding, Entry, OutputKind

PASSAGE = " ".join(["water"] * 25)  # 27 tokens with [CLS] and [SEP]
QUERY = "a short query"  # 5 tokens


@dataclass
class Model:
    infer: Infer
    backend: FaultyBackend


@dataclass
class Loaded:
    spec: ModelSpec
    backend: Backend


@pytest.fixture(scope="module")
def loaded(minilm: Path) -> Loaded:
    """all-MiniLM-L6-v2 loaded once: each test's pipelines wrap it in their own FaultyBackend.

    On the native model for every pass: the tests' bulk units are under 64 tokens, which the
    start-up plan may put on the short passes' ONNX graph, and that has no points between
    layers where a query could run."""
    settings = ModelSettings(str(minilm))
    spec = load_model_spec(minilm, settings)
    with fixed_pass_plan():
        return Loaded(spec, select_backend(spec, settings))


class Rig:
    """One scheduler (its own device thread) and the pipelines the test adds to it."""

    def __init__(
        self, minilm: Path, loaded: Loaded, preempt: bool, trimmer: HeapTrimmer | None = None
    ) -> None:
        self.minilm = minilm
        self.scheduler = Scheduler(preempt=preempt, trimmer=trimmer)
        self.spec = loaded.spec
        self.inner = loaded.backend
        self.models: list[Model] = []

    def add(self, **settings: object) -> Model:
        values: dict[str, object] = {"bulk_pass_tokens": 64, "tokenization_workers": 1}
        values.update(settings)
        backend = FaultyBackend(self.inner)
        ms = ModelSettings(str(self.minilm), **values)  # type: ignore[arg-type]
        infer = build_pipeline(ServerSettings(), ms, self.spec, backend, scheduler=self.scheduler)
        model = Model(infer, backend)
        self.models.append(model)
        return model

    def close(self) -> None:
        for model in self.models:
            if model.backend.gate is not None:
                model.backend.gate.set()
            model.infer.worker.stop()
            model.infer.tokenizers.close()
        self.scheduler.stop()


@pytest.fixture
def rig(minilm: Path, loaded: Loaded) -> Iterator[Callable[..., Rig]]:
    made: list[Rig] = []

    def make(preempt: bool = True, trimmer: HeapTrimmer | None = None) -> Rig:
        made.append(Rig(minilm, loaded, preempt, trimmer))
        return made[-1]

    yield make
    for r in made:
        r.close()


async def hold(model: Model) -> None:
    """Gate the model's forwards and wait until the device thread is held at the first one."""
    await asyncio.to_thread(model.backend.started.wait, 60)


def kinds(model: Model) -> list[str]:
    return ["bulk" if len(b) > 1 or len(b[0]) > 5 else "query" for b in model.backend.batches]


@pytest.mark.parametrize("preempt", [True, False], ids=["layer-preemption", "units-only"])
def test_an_interactive_entry_runs_before_queued_bulk_units(
    rig: Callable[[bool], Rig], preempt: bool
) -> None:
    r = rig(preempt)
    model = r.add()
    model.backend.gate = threading.Event()

    async def scenario() -> None:
        bulk = asyncio.ensure_future(model.infer.embed([PASSAGE] * 6, priority="bulk"))
        await hold(model)
        query = asyncio.ensure_future(model.infer.embed([QUERY]))  # interactive by default
        await until(lambda: model.infer.queue.waiting(Lane.INTERACTIVE) == 1)
        model.backend.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(bulk, query)

    asyncio.run(scenario())
    # Six passages of 27 tokens under a 64-token unit: three bulk units of two.
    assert kinds(model) == ["bulk", "query", "bulk", "bulk"]
    events = model.backend.events
    if preempt:
        # The query ran inside the first bulk unit's forward, between two of its layers.
        assert events[:4] == [("start", 0), ("start", 1), ("end", 1), ("end", 0)]
    else:
        assert events[:4] == [("start", 0), ("end", 0), ("start", 1), ("end", 1)]
    # Answer builders give way to the query's pass, not to the bulk passes.
    assert model.backend.interactive_marked == [False, True, False, False]


def test_bulk_is_not_starved_by_a_flood_of_queries(rig: Callable[[bool], Rig]) -> None:
    r = rig(False)
    r.scheduler.interactive_burst_tokens = 10  # two queries
    model = r.add(max_batch_requests=1)
    model.backend.gate = threading.Event()

    async def scenario() -> None:
        bulk = asyncio.ensure_future(model.infer.embed([PASSAGE] * 2, priority="bulk"))
        await hold(model)
        queries = [asyncio.ensure_future(model.infer.embed([QUERY])) for _ in range(8)]
        await until(lambda: model.infer.queue.waiting(Lane.INTERACTIVE) == 8)
        model.backend.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(bulk, *queries)

    asyncio.run(scenario())
    assert kinds(model) == ["bulk", "query", "query", "bulk"] + ["query"] * 6


def test_bulk_finishes_inside_preemption_while_queries_keep_coming(
    rig: Callable[[bool], Rig],
) -> None:
    r = rig(True)
    r.scheduler.interactive_burst_tokens = 10
    model = r.add(max_batch_requests=1, bulk_pass_tokens=16384)

    async def scenario() -> int:
        bulk = asyncio.ensure_future(model.infer.embed([PASSAGE] * 16, priority="bulk"))
        sent = 0

        async def client() -> None:
            nonlocal sent
            while not bulk.done():
                await model.infer.embed([QUERY])
                sent += 1
                assert sent < 5000, "the bulk request never finished"

        await asyncio.gather(bulk, *(client() for _ in range(6)))
        return sent

    assert asyncio.run(scenario()) > 0
    assert "bulk" in kinds(model)


def _order(models: list[Model]) -> list[int]:
    """Which model each batch of the device thread belonged to, in the order they started."""
    tagged = [(t, i) for i, m in enumerate(models) for t in m.backend.started_at]
    return [i for _, i in sorted(tagged)]


def test_a_flooded_model_does_not_starve_another(rig: Callable[[bool], Rig]) -> None:
    r = rig(False)
    flooded, other = r.add(), r.add()
    flooded.backend.gate = threading.Event()

    async def scenario() -> None:
        first = asyncio.ensure_future(flooded.infer.embed([PASSAGE] * 4, priority="bulk"))
        await hold(flooded)
        rest = [
            asyncio.ensure_future(flooded.infer.embed([PASSAGE] * 4, priority="bulk"))
            for _ in range(4)
        ]
        await until(lambda: flooded.infer.queue.waiting(Lane.BULK) == 18)
        mine = asyncio.ensure_future(other.infer.embed([PASSAGE] * 4, priority="bulk"))
        await until(lambda: other.infer.queue.waiting(Lane.BULK) == 4)
        flooded.backend.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(first, mine, *rest)

    asyncio.run(scenario())
    order = _order([flooded, other])
    assert order.count(0) == 10 and order.count(1) == 2
    # Equal weights: the other model's two units alternate with the flood's, they do not wait
    # for its ten.
    assert order[:5] == [0, 1, 0, 1, 0], order


def test_weights_share_the_device_in_proportion(rig: Callable[[bool], Rig]) -> None:
    r = rig(False)
    light, heavy = r.add(), r.add(scheduler_weight=3.0)
    light.backend.gate = threading.Event()

    async def scenario() -> None:
        first = asyncio.ensure_future(light.infer.embed([PASSAGE] * 2, priority="bulk"))
        await hold(light)
        flood = [
            asyncio.ensure_future(m.infer.embed([PASSAGE] * 16, priority="bulk"))
            for m in (light, heavy)
        ]
        await until(lambda: heavy.infer.queue.waiting(Lane.BULK) == 16)
        await until(lambda: light.infer.queue.waiting(Lane.BULK) == 16)
        light.backend.gate.set()  # type: ignore[union-attr]
        await asyncio.gather(first, *flood)

    asyncio.run(scenario())
    order = _order([light, heavy])
    # After the held unit: three units of the weight-3 model for each of the other's.
    assert order[1:9].count(1) == 6, order


def test_a_failing_batch_of_one_model_fails_nobody_else(rig: Callable[[bool], Rig]) -> None:
    r = rig(True)
    broken, healthy = r.add(), r.add()
    broken.backend.fail_if = lambda batch: True

    async def scenario() -> tuple[BaseException | list[np.ndarray], ...]:
        results = await asyncio.gather(
            broken.infer.embed([QUERY]),
            healthy.infer.embed([QUERY]),
            broken.infer.embed([PASSAGE] * 4, priority="bulk"),
            healthy.infer.embed([PASSAGE] * 4, priority="bulk"),
            return_exceptions=True,
        )
        return tuple(r if isinstance(r, BaseException) else r.values for r in results)

    b1, h1, b2, h2 = asyncio.run(scenario())
    assert isinstance(b1, BackendError) and "injected fault" in b1.message
    assert isinstance(b2, BackendError)
    assert isinstance(h1, list) and len(h1) == 1
    assert isinstance(h2, list) and len(h2) == 4
    broken.backend.fail_if = None
    assert len(asyncio.run(broken.infer.embed([QUERY])).values) == 1
    assert r.scheduler.alive


def test_a_batch_that_cannot_be_built_fails_alone_and_the_thread_survives(
    rig: Callable[[bool], Rig],
) -> None:
    model = rig(True).add()

    async def scenario() -> BaseException | None:
        loop = asyncio.get_running_loop()
        # Not token ids: packing the batch raises before any forward.
        bad = Entry(
            Encoding(["not a token"], [0]),  # type: ignore[list-item]
            OutputKind.POOLED,
            loop.create_future(),
            loop,
        )
        model.infer.queue.put([bad], Lane.INTERACTIVE)
        try:
            await bad.future
        except BaseException as exc:
            return exc
        return None

    error = asyncio.run(scenario())
    assert isinstance(error, BackendError), error
    assert len(asyncio.run(model.infer.embed([QUERY])).values) == 1


def test_a_failure_recording_metrics_loses_no_answer(rig: Callable[[bool], Rig]) -> None:
    model = rig(True).add()
    calls = 0

    def broken_metrics(*args: object) -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("injected metrics fault")

    model.infer.worker.on_batch = broken_metrics
    for _ in range(2):
        assert len(asyncio.run(model.infer.embed([QUERY, PASSAGE])).values) == 2
    assert calls == 2
    assert model.infer.worker.alive


def test_a_batchs_metrics_are_recorded_on_the_loop_after_its_answers(
    rig: Callable[[bool], Rig],
) -> None:
    """The device thread hands the batch's metrics to the event loop with the answers: it
    lets go of the interpreter lock at once, and the loop records them after the callers it
    woke have run."""
    model = rig(True).add()
    seen: list[tuple[str, bool, int]] = []
    record = model.infer.worker.on_batch
    assert record is not None
    entries: list[Entry] = []
    put = model.infer.queue.put

    def keep(batch: Iterable[Entry], *args: object) -> None:
        batch = list(batch)
        entries.extend(batch)
        put(batch, *args)  # type: ignore[arg-type]

    def on_batch(batch: Batch, elapsed: float, ok: bool) -> None:
        seen.append(
            (threading.current_thread().name, all(e.future.done() for e in entries), batch.size)
        )
        record(batch, elapsed, ok)

    model.infer.worker.on_batch = on_batch
    model.infer.queue.put = keep  # type: ignore[method-assign]

    async def scenario() -> threading.Thread:
        await model.infer.embed([QUERY, PASSAGE])
        await asyncio.sleep(0)  # the loop's next turn: where the metrics wait
        return threading.current_thread()

    loop_thread = asyncio.run(scenario())
    assert seen == [(loop_thread.name, True, 2)]
    assert model.infer.metrics.value("vectorpress_batch_real_tokens") > 0


def test_work_put_after_shutdown_began_fails_at_once(rig: Callable[[bool], Rig]) -> None:
    r = rig(True)
    closing, other = r.add(), r.add()
    closing.infer.queue.close()  # what stop() does first
    with pytest.raises(UnhealthyError, match="shutting down"):
        asyncio.run(closing.infer.embed([QUERY]))
    assert len(asyncio.run(other.infer.embed([QUERY])).values) == 1
    closing.infer.worker.stop()
    other.infer.worker.stop()  # the last model stopped ends the device thread
    assert not r.scheduler.alive
    with pytest.raises(UnhealthyError):
        asyncio.run(other.infer.embed([QUERY]))


def test_the_heap_is_trimmed_once_the_device_rests_and_never_while_a_unit_runs(
    rig: Callable[..., Rig],
) -> None:
    trimmer, trims = recording_trimmer(rest_s=0.05)
    r = rig(True, trimmer)
    model = r.add()
    model.backend.gate = threading.Event()

    async def scenario() -> None:
        query = asyncio.ensure_future(model.infer.embed([QUERY]))
        await hold(model)
        before = len(trims)
        await asyncio.sleep(0.3)  # the unit runs six rests long
        assert len(trims) == before
        model.backend.gate.set()  # type: ignore[union-attr]
        await query
        await until(lambda: len(trims) == before + 1)
        await asyncio.sleep(0.3)  # nothing ran since: nothing more to hand back
        assert len(trims) == before + 1

    asyncio.run(scenario())
