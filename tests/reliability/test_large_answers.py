"""A large answer is built off the event loop: a small request sent while it is being built is
answered first.

Judged by order, never by time: the small request is sent once the large one's input has been
tokenized (its `_tokenize` call seen running on a pool thread, then gone) or its vectors
computed (the success counter moved), so what is left of the large request is building its
answer. Built on the loop, that would hold the small request back until the large answer was
sent.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.grpc.clients import Stubs
from tests.helpers.server import LiveServer
from vectorpress.api.grpc.stubs import pb
from vectorpress.settings import Settings

#: 30,000 different CJK characters: one token each in MiniLM's vocabulary.
CJK = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(30_000))


@pytest.fixture(scope="module")
def served(minilm: Path) -> Iterator[tuple[LiveServer, Stubs]]:
    # Room for 24 of the large inputs in one body (4.3 MB): their answer then takes long enough
    # to build that a small request sent once tokenization ends has time to overtake it.
    settings = Settings.single(str(minilm), payload_limit=8_000_000)
    with LiveServer(settings, grpc=True) as srv:
        stubs = Stubs.connect(srv.grpc_target)
        try:
            yield srv, stubs
        finally:
            stubs.channel.close()


def _running(function: str) -> bool:
    """Whether a thread of this process (the server's) is inside `function` right now."""
    for frame in sys._current_frames().values():
        f = frame
        while f is not None:
            if f.f_code.co_name == function:
                return True
            f = f.f_back
    return False


def _tokenized() -> Callable[[], bool]:
    """True once `_tokenize` has been seen running and has returned."""
    seen = False

    def done() -> bool:
        nonlocal seen
        now = _running("_tokenize")
        seen = seen or now
        return seen and not now

    return done


def _order(
    srv: LiveServer, send_large: Callable[[Callable[[], None]], None], built: Callable[[], bool]
) -> list[str]:
    """Start the large request; once `built()`, send a one-word /embed; the order answered."""
    order: list[str] = []
    lock = threading.Lock()

    def mark(name: str) -> None:
        with lock:
            order.append(name)

    small = {"inputs": "hello"}
    with httpx.Client(base_url=srv.url, timeout=120) as client:
        assert client.post("/embed", json=small).status_code == 200  # connected, warm
        large = threading.Thread(target=send_large, args=(lambda: mark("large"),))
        large.start()
        try:
            while not built() and not order:
                time.sleep(0.001)
            assert not order, "the large request was answered before its answer was seen built"
            assert client.post("/embed", json=small).status_code == 200
            mark("small")
        finally:
            large.join(300)
    return order


def _small_first(
    srv: LiveServer, send_large: Callable[[Callable[[], None]], None], built: Callable[[], bool]
) -> None:
    """The small request is answered first in one of three tries: a busy machine can delay one
    small request past the end of the build now and then; a builder that holds the event loop
    loses every try."""
    orders = []
    for _ in range(3):
        orders.append(_order(srv, send_large, built()))
        if orders[-1] == ["small", "large"]:
            return
    raise AssertionError(f"the large answer was built first in every try: {orders}")


def _http_large(srv: LiveServer, path: str, body: object) -> Callable[[Callable[[], None]], None]:
    def send(answered: Callable[[], None]) -> None:
        with httpx.stream("POST", f"{srv.url}{path}", json=body, timeout=300) as response:
            answered()  # its status line and headers: the answer has been built
            assert response.status_code == 200
            response.read()

    return send


def test_http_tokenize(served: tuple[LiveServer, Stubs]) -> None:
    srv, _ = served
    large = _http_large(srv, "/tokenize", {"inputs": [CJK] * 24})
    _small_first(srv, large, _tokenized)


def test_grpc_tokenize(served: tuple[LiveServer, Stubs]) -> None:
    srv, stubs = served

    def send(answered: Callable[[], None]) -> None:
        response = stubs.tokenize.Tokenize(
            pb.EncodeRequest(inputs=CJK * 2, add_special_tokens=True), timeout=300
        )
        answered()
        assert len(response.tokens) == 60_002

    _small_first(srv, send, _tokenized)


def _computed(srv: LiveServer, method: str) -> Callable[[], bool]:
    before = srv.infer.metrics.value("te_request_success", method=method)
    return lambda: srv.infer.metrics.value("te_request_success", method=method) > before


@pytest.mark.slow
def test_http_embed_all(served: tuple[LiveServer, Stubs]) -> None:
    srv, _ = served
    body = {"inputs": [" ".join(["word"] * 250)] * 16, "truncate": True}
    large = _http_large(srv, "/embed_all", body)
    _small_first(srv, large, lambda: _computed(srv, "batch"))


def test_results_are_complete(served: tuple[LiveServer, Stubs]) -> None:
    """The chunked answers are whole: every token, in order, over HTTP and gRPC."""
    srv, stubs = served
    text = CJK[:20_000]
    tokens = httpx.post(f"{srv.url}/tokenize", json={"inputs": [text, "ab"]}, timeout=120).json()
    ids = srv.infer.tokenizers._new_tokenizer().encode(text).ids
    assert [t["id"] for t in tokens[0]] == ids
    assert [t["text"] for t in tokens[0][1:-1]] == list(text)
    assert tokens[0][5]["start"] == 3 * 4 and tokens[0][5]["stop"] == 3 * 5
    cls = {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert tokens[0][0] == cls
    reply = stubs.tokenize.Tokenize(pb.EncodeRequest(inputs=text, add_special_tokens=True))
    assert [t.id for t in reply.tokens] == ids
    assert not reply.tokens[0].HasField("start") and reply.tokens[5].stop == 15
    decoded = stubs.tokenize.Decode(pb.DecodeRequest(ids=ids))
    assert decoded.text == srv.infer.tokenizers._new_tokenizer().decode(ids, False)
