"""The gathering transport: a response's head and body leave in one write, a lone write at the
end of the loop's turn, and nothing is lost on close."""

from __future__ import annotations

import asyncio
from typing import Any

from vectorpress.api.protocol import GATHER_BYTES, _GatheringTransport


class _Recording(asyncio.Transport):
    """A transport that records each write it is asked to make."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


def test_head_and_body_leave_in_one_write() -> None:
    async def scenario() -> list[bytes]:
        real = _Recording()
        gathering = _GatheringTransport(real)
        gathering.write(b"HTTP/1.1 200 OK\r\n\r\n")
        assert real.writes == []  # held for the body
        assert gathering.get_write_buffer_size() == 19
        gathering.write(b"[1.0]")
        return real.writes

    assert asyncio.run(scenario()) == [b"HTTP/1.1 200 OK\r\n\r\n[1.0]"]


def test_a_large_body_is_not_copied_behind_the_head() -> None:
    async def scenario() -> list[bytes]:
        real = _Recording()
        gathering = _GatheringTransport(real)
        gathering.write(b"HTTP/1.1 200 OK\r\n\r\n")
        gathering.write(body)
        return real.writes

    body = b"x" * (GATHER_BYTES + 1)
    writes = asyncio.run(scenario())
    assert writes == [b"HTTP/1.1 200 OK\r\n\r\n", body] and writes[1] is body


def test_a_large_first_write_leaves_at_once() -> None:
    async def scenario() -> list[bytes]:
        real = _Recording()
        _GatheringTransport(real).write(chunk)
        return list(real.writes)  # before the turn ends

    chunk = b"x" * (GATHER_BYTES + 1)
    writes = asyncio.run(scenario())
    assert writes == [chunk] and writes[0] is chunk


def test_a_lone_write_leaves_at_the_end_of_the_turn() -> None:
    async def scenario() -> list[list[bytes]]:
        real = _Recording()
        gathering = _GatheringTransport(real)
        gathering.write(b"chunk one")
        seen = [list(real.writes)]
        await asyncio.sleep(0)  # the loop's turn ends
        seen.append(list(real.writes))
        gathering.write(b"chunk two")  # a later turn: held again, then sent
        await asyncio.sleep(0)
        seen.append(list(real.writes))
        return seen

    assert asyncio.run(scenario()) == [
        [],
        [b"chunk one"],
        [b"chunk one", b"chunk two"],
    ]


def test_close_sends_what_is_held_and_the_rest_is_the_real_transports() -> None:
    async def scenario() -> _Recording:
        real = _Recording()
        gathering = _GatheringTransport(real)
        assert gathering.get_extra_info("peername") == ("127.0.0.1", 1)
        gathering.write(b"last words")
        gathering.close()
        await asyncio.sleep(0)  # the held flush then finds nothing left to send
        return real

    real = asyncio.run(scenario())
    assert real.writes == [b"last words"] and real.closed
