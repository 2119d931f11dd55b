"""The server's malloc arenas: one per thread that allocates much, so that tokenizer threads do
not queue on each other's arena locks (bench/tokenize_threads.py measures the cost)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from vectorpress import server
from vectorpress.core.heap import malloc_arenas
from vectorpress.settings import ServerSettings, Settings


class _Stop(Exception):
    pass


def test_one_arena_per_tokenizer_thread_plus_the_loop_and_the_model_thread() -> None:
    assert malloc_arenas(1) == 3
    assert malloc_arenas(15) == 17
    assert malloc_arenas(0) == 2


def test_load_caps_the_arenas_for_every_models_tokenizer_threads(
    minilm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []

    def record(arenas: int) -> None:
        asked.append(arenas)
        raise _Stop  # the cap is load's first step: nothing else needs to run

    monkeypatch.setattr(server, "limit_malloc_arenas", record)
    one = Settings.single(str(minilm), tokenization_workers=3).models[0]
    two = replace(one, served_model_name="second", tokenization_workers=5)
    with pytest.raises(_Stop):
        server.load(Settings(ServerSettings(), (one, two)))
    assert asked == [3 + 5 + 2]
