"""The thread count of small CPU passes follows whichever count measures faster."""

from __future__ import annotations

from vectorpress.backends.torch.passes import SMALL_PASS_TOKENS, ThreadChooser


def _drive(chooser: ThreadChooser, seconds: dict[int, float], passes: int) -> list[int]:
    """Run `passes` small passes whose time depends only on the thread count."""
    picked = []
    for _ in range(passes):
        n = chooser.choose(16, 2)
        chooser.record(n, 16, seconds[n])
        picked.append(n)
    return picked


def test_large_passes_use_every_thread_and_are_not_timed() -> None:
    chooser = ThreadChooser()
    assert chooser.choose(SMALL_PASS_TOKENS, 2) == 2
    chooser.record(2, SMALL_PASS_TOKENS, 5.0)
    assert chooser.cost == {}
    assert chooser.choose(10, 1) == 1


def test_both_counts_are_measured_then_the_faster_one_is_kept() -> None:
    chooser = ThreadChooser(probe_every=10)
    picked = _drive(chooser, {1: 0.010, 2: 0.006}, 100)
    assert picked[:2] == [1, 2]
    assert chooser.best == 2
    # Mostly the faster count; the slower one only as a rare probe.
    assert picked[2:].count(1) <= 10
    assert picked[-1] == 2 or picked[-2] == 2


def test_a_losing_probe_backs_off_and_a_change_of_load_is_followed() -> None:
    chooser = ThreadChooser(probe_every=4, max_probe_every=64)
    _drive(chooser, {1: 0.010, 2: 0.006}, 200)
    assert chooser.best == 2
    assert chooser.every == 64  # every probe of one thread lost: tried ever more rarely
    # The machine gets busy: two threads now stall on every barrier.
    picked = _drive(chooser, {1: 0.010, 2: 0.100}, 300)
    assert chooser.best == 1
    assert picked[-50:].count(2) <= 2
    # Busy no more.
    _drive(chooser, {1: 0.010, 2: 0.006}, 600)
    assert chooser.best == 2
