"""uvicorn's httptools protocol with a response's head and body in one socket write.

uvicorn writes the status line and headers when the app sends `http.response.start` and the
body when it sends `http.response.body`: two `send` calls, two TCP segments on the wire and, on
loopback, two passes through the kernel's TCP path and two wake-ups of a client that reads the
head and then waits for the body. The transport here holds a write until the next one, or the
end of the loop's turn, whichever comes first: a response sent as its two ASGI messages back to
back (every JSON answer of this server) leaves in one write (any write over `GATHER_BYTES` goes
out at once, on its own, not copied), and a body streamed over several turns still leaves as it
comes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

#: A body larger than this leaves in a write of its own rather than copied in behind the head.
GATHER_BYTES = 64 * 1024


class _GatheringTransport:
    """A transport that writes what one loop turn wrote in one call; everything else is the
    real transport's."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._parts: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if len(data) > GATHER_BYTES:  # nothing to win by holding it: a copy costs more
            self._flush()
            self._transport.write(data)
            return
        # The first write waits; the next one (the body after the head) leaves with it at once,
        # before the callbacks this turn queued after the response (its metrics) run.
        held = bool(self._parts)
        self._parts.append(bytes(data))
        if held:
            self._flush()
        else:
            self._loop.call_soon(self._flush)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def _flush(self) -> None:
        if not self._parts:
            return
        parts, self._parts = self._parts, []
        if not self._transport.is_closing():
            self._transport.write(parts[0] if len(parts) == 1 else b"".join(parts))

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self._parts)) + self._transport.get_write_buffer_size()

    def write_eof(self) -> None:
        self._flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._parts = []
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class GatheringHttpTools(HttpToolsProtocol):
    """`uvicorn.Config(http=GatheringHttpTools)`: HttpToolsProtocol on a gathering transport."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_GatheringTransport(transport))  # type: ignore[arg-type]
