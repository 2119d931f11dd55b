"""`give_way()` waits while an interactive pass runs, on threads that allow it, and never on an
event loop's thread. Judged by where the threads are, never by how long they took."""

from __future__ import annotations

import asyncio
import sys
import threading
import time

import pytest

from vectorpress.core import giveway


def _waiting_in_give_way(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "give_way":
            return True
        frame = frame.f_back
    return False


def _until(check: object) -> None:
    for _ in range(6000):
        if check():  # type: ignore[operator]
            return
        time.sleep(0.005)
    raise AssertionError("the condition never came true")


@pytest.fixture
def long_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    # A minute: a builder seen waiting can only be let go by the pass ending.
    monkeypatch.setattr(giveway, "GIVE_WAY_S", 60.0)


def test_a_builder_waits_for_the_interactive_pass_to_end(long_wait: None) -> None:
    done = threading.Event()

    def builder() -> None:
        with giveway.may_give_way():
            giveway.give_way()
        done.set()

    with giveway.interactive_pass():
        assert giveway.interactive_running()
        thread = threading.Thread(target=builder, daemon=True)
        thread.start()
        _until(lambda: _waiting_in_give_way(thread))
        assert not done.is_set()
    thread.join(30)
    assert done.is_set() and not giveway.interactive_running()


def test_nested_and_overlapping_passes_count(long_wait: None) -> None:
    with giveway.interactive_pass():
        with giveway.interactive_pass():
            pass
        assert giveway.interactive_running()  # the outer pass still runs
    assert not giveway.interactive_running()
    with pytest.raises(RuntimeError), giveway.interactive_pass():
        raise RuntimeError("a failed pass")
    assert not giveway.interactive_running()


def _returns(fn: object) -> bool:
    """Whether `fn()` returns while the test waits (a wait in give_way would last a minute)."""
    thread = threading.Thread(target=fn, daemon=True)  # type: ignore[arg-type]
    thread.start()
    thread.join(20)
    return not thread.is_alive()


def test_no_wait_where_not_allowed_nor_on_an_event_loop(long_wait: None) -> None:
    async def on_the_loop() -> None:
        with giveway.may_give_way():  # never so on a loop's thread in the server; and even then
            pass
        giveway.give_way()

    def not_allowed() -> None:
        with giveway.may_give_way():
            pass
        giveway.give_way()  # allowed only inside the block

    with giveway.interactive_pass():
        assert _returns(giveway.give_way)  # a thread that never allowed it
        assert _returns(not_allowed)
        assert _returns(lambda: asyncio.run(on_the_loop()))


def test_no_wait_without_an_interactive_pass(long_wait: None) -> None:
    def allowed() -> None:
        with giveway.may_give_way():
            giveway.give_way()

    assert _returns(allowed)
