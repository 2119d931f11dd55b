"""The real all-mpnet-base-v2, reassembled from its PyPI wheels, served natively over HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.helpers.mpnet import mpnet_path
from tests.helpers.reference import assert_close_vectors, st_encode
from tests.helpers.server import LiveServer
from tests.helpers.texts import mixed_texts
from vectorpress.settings import Settings

pytestmark = pytest.mark.slow

FOOD, BREAD, MOVIE = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awful.",
)


@pytest.fixture(scope="module")
def mpnet() -> Path:
    return mpnet_path()


@pytest.fixture(scope="module")
def server(mpnet: Path) -> Iterator[LiveServer]:
    with LiveServer(Settings.single(str(mpnet))) as srv:
        yield srv


def embed(server: LiveServer, inputs: list[str]) -> np.ndarray:
    response = httpx.post(f"{server.url}/embed", json={"inputs": inputs}, timeout=120)
    assert response.status_code == 200, response.text
    return np.array(response.json())


def test_served_natively_with_its_own_limits(server: LiveServer) -> None:
    assert server.served is not None
    assert server.served.backend.name == "torch"
    assert server.served.spec.max_input_length == 384
    assert server.served.spec.position_offset == 2


def test_golden_similarities(server: LiveServer) -> None:
    food, bread, movie = embed(server, [FOOD, BREAD, MOVIE])
    assert round(float(food @ bread), 4) == 0.6601
    assert round(float(food @ movie), 4) == -0.0134


def test_parity_with_sentence_transformers(server: LiveServer, mpnet: Path) -> None:
    # Long texts run past 384 tokens and are truncated on both sides alike.
    texts = [FOOD, BREAD, MOVIE, *mixed_texts(9, seed=21, long_share=0.15)]
    want = st_encode(mpnet, texts)
    got = embed(server, texts)
    assert_close_vectors(got, want, max_abs=1e-4, what="all-mpnet-base-v2")
    alone = embed(server, [texts[5]])
    assert_close_vectors(alone, got[5:6], max_abs=1e-5, what="alone vs in a batch")
