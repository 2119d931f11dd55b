"""Start-up's CPU plan (`passes.plan_when_quiet`): timed again while other processes keep the
CPUs busy, so that a server started beside another does not keep, for its whole life, the
kernels the other's load favoured."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from vectorpress.backends.torch import passes
from vectorpress.backends.torch.backend import TorchBackend
from vectorpress.backends.torch.passes import (
    GRAPH,
    PassPlan,
    plan_passes,
    plan_when_quiet,
    planning_alone,
)
from vectorpress.cpus import available_cpus
from vectorpress.model_spec import load_model_spec
from vectorpress.settings import ModelSettings

PLANS = [PassPlan(True, True, 1), PassPlan(False, True, 0), PassPlan(False, False, 1, GRAPH)]


Measure = Callable[[Callable[[], PassPlan]], tuple[PassPlan, float | None]]


def _measures(loads: list[float | None]) -> tuple[Measure, list[int]]:
    """A stand-in for `timed_against_others`: the next of PLANS, with the next of `loads`."""
    calls: list[int] = []

    def measure(plan: Callable[[], PassPlan]) -> tuple[PassPlan, float | None]:
        calls.append(len(calls))
        return PLANS[len(calls) - 1], loads[len(calls) - 1]

    return measure, calls


def test_a_plan_timed_under_load_is_timed_again_until_the_cpus_are_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    measure, calls = _measures([0.9, 0.6, 0.1])
    with caplog.at_level(logging.INFO, logger=passes.__name__):
        plan = plan_when_quiet(lambda: PLANS[0], pause=0.0, measure=measure)
    assert plan == PLANS[2] and len(calls) == 3
    assert caplog.text.count("timing them again") == 2
    assert "WARNING" not in caplog.text


def test_a_quiet_or_unknown_load_keeps_the_first_plan() -> None:
    for load in (0.0, passes.PLAN_CONTENTION, None):
        measure, calls = _measures([load, 0.0, 0.0])
        assert plan_when_quiet(lambda: PLANS[0], pause=0.0, measure=measure) == PLANS[0]
        assert len(calls) == 1


def test_a_load_that_never_ends_keeps_the_last_plan_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    measure, calls = _measures([0.9, 0.9, 0.9])
    with caplog.at_level(logging.INFO, logger=passes.__name__):
        plan = plan_when_quiet(lambda: PLANS[0], attempts=3, pause=0.0, measure=measure)
    assert plan == PLANS[2] and len(calls) == 3
    assert "on every one of 3 tries" in caplog.text


def test_a_real_plan_beside_spinning_processes_waits_for_them(
    tiny_bert_family: Callable[..., Path], caplog: pytest.LogCaptureFixture
) -> None:
    folder = tiny_bert_family("bert", "embedding")
    spec = load_model_spec(folder, ModelSettings(str(folder)))
    encoder = TorchBackend(spec, "cpu", "float32").model.encoder
    # Every CPU this process may use held by another process for about 1.5 s.
    spin = "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(available_cpus())]
    try:
        time.sleep(0.3)
        with caplog.at_level(logging.INFO, logger=passes.__name__):
            plan = plan_when_quiet(lambda: plan_passes(encoder, spec.position_offset))
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert isinstance(plan, PassPlan)
    assert "timing them again" in caplog.text


def test_servers_of_one_machine_plan_one_at_a_time(tmp_path: Path) -> None:
    lock = tmp_path / "plan.lock"
    with planning_alone(lock) as first:
        assert first
        # Another holder (another open file, as another server's) waits, then plans without.
        started = time.monotonic()
        with planning_alone(lock, wait=0.3) as second:
            assert not second
        assert time.monotonic() - started >= 0.3
    with planning_alone(lock, wait=0.3) as after:
        assert after
    # A lock that cannot be made does not stop a start.
    with planning_alone(tmp_path / "missing" / "plan.lock") as unlocked:
        assert not unlocked
