"""The benchmark corpus is the same texts in every process."""

from __future__ import annotations

import inspect

import pytest
from bench import corpus as bench_corpus


def test_a_patched_stdlib_function_does_not_move_the_corpus(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Importing Ray replaces inspect.isgenerator with a function without a docstring: read from
    # this process, every text after that sentence moved (a parity test then compared vectors
    # of texts other than the ones it meant).
    before = bench_corpus.corpus(300, seed=0)
    bench_corpus._fresh.cache_clear()
    monkeypatch.setattr(inspect, "isgenerator", lambda obj: False)
    assert bench_corpus.corpus(300, seed=0) == before
    assert "Return true if the object is a generator." in bench_corpus.sentences()
