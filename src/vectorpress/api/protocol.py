"""uvicorn's httptools protocol with a response's head and body in one socket write.

uvicorn writes the status line and headers when the app sends `http.response.start` and the
body when it sends `http.response.body`: two `send` calls, two TCP segments on the wire and, on
loopback, two passes through the kernel's TCP path and two wake-ups of a client that reads the
head and then waits for the body. The transport here holds a write until the next one, or the
end of the loop's turn, whichever comes first: a response sent as its two ASGI messages back to
back (every JSON answer of this server) leaves in one write (any write over `GATHER_BYTES` goes
out at once, on its own, not copied), and a body streamed over several turns still leaves as it
comes.

The protocol also hands the inference routes an `Exchange` in each request's scope: a finished
JSON answer written to the connection in one call, as uvicorn's two `send`s would write it, and
a disconnect reported by the connection itself rather than by a task per request that waits on
`receive`. Both cost a few Python calls each with the caches cold from the forward pass where
the ASGI way costs dozens (each send through three layers' wrappers, each header checked by two
regular expressions, a task created and cancelled per request).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable
from functools import cache
from http import HTTPStatus
from typing import Any

from uvicorn.logging import TRACE_LOG_LEVEL
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

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

    def write_now(self, data: bytes) -> None:
        """`data` on the wire now, behind anything held (an answer whose last byte this is)."""
        if self._parts:
            self._parts.append(data)
            self._flush()
        elif not self._transport.is_closing():
            self._transport.write(data)

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


#: Where a request's scope holds its `Exchange` (absent under any other protocol).
EXCHANGE = "vectorpress.exchange"


@cache
def _status_line(status: int) -> bytes:
    return b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode())


class Exchange:
    """One request's connection, as the lane's routes use it beside the ASGI calls."""

    __slots__ = ("_cycle", "bare", "on_disconnect")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        # Weak: the cycle holds the scope that holds this, and a cycle of references would
        # wait for the garbage collector after every request.
        self._cycle = weakref.ref(cycle)
        self.on_disconnect: Callable[[], None] | None = None
        """Called (once, from the protocol) when the client goes before its answer is done."""
        self.bare = False
        """Set where no layer between the protocol and the route wraps `send` (the app's lane):
        `respond` may then write past them."""

    @property
    def started(self) -> bool:
        """Whether an answer has begun, by either way."""
        cycle = self._cycle()
        return cycle is None or cycle.response_started

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Write a whole answer as uvicorn's `send` would write it from its two messages (its
        default headers first, `connection: close` where the connection ends) and finish the
        request; False, having done nothing, where the ASGI `send` must do it: a layer outside
        that wraps `send` (not `bare`: CORS adds its headers there), an answer begun, the client
        gone, the connection's writes paused for a slow reader, a log line uvicorn's `send`
        would write, or a HEAD request (no body goes out).

        `headers` are this server's own, well-formed and lower-case, with a content-length.
        """
        cycle = self._cycle()
        if (
            not self.bare
            or cycle is None
            or cycle.response_started
            or cycle.disconnected
            or cycle.flow.write_paused
            or cycle.scope["method"] == "HEAD"
            # uvicorn's `send` writes the access line; at its trace level a layer that wraps
            # `send` logs each ASGI message.
            or (cycle.access_log and cycle.access_logger.isEnabledFor(logging.INFO))
            or cycle.logger.isEnabledFor(TRACE_LOG_LEVEL)
        ):
            return False
        parts = [_status_line(status)]
        for name, value in cycle.default_headers:
            parts += (name, b": ", value, b"\r\n")
        for name, value in headers:
            parts += (name, b": ", value, b"\r\n")
        if not cycle.keep_alive:
            parts.append(b"connection: close\r\n")
        parts += (b"\r\n", body)
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        cycle.response_complete = True
        transport = cycle.transport
        data = b"".join(parts)
        if isinstance(transport, _GatheringTransport):
            transport.write_now(data)
        else:
            transport.write(data)
        cycle.message_event.set()
        if not cycle.keep_alive:
            transport.close()
        cycle.on_response()
        return True


class GatheringHttpTools(HttpToolsProtocol):
    """`uvicorn.Config(http=GatheringHttpTools)`: HttpToolsProtocol on a gathering transport,
    each request's scope with its `Exchange`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_GatheringTransport(transport))  # type: ignore[arg-type]

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        # No new cycle for an upgrade: the scope then has no exchange.
        if cycle is not None and cycle.scope is self.scope:
            self.scope[EXCHANGE] = Exchange(cycle)  # type: ignore[literal-required]

    def connection_lost(self, exc: Exception | None) -> None:
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is None or not cycle.disconnected:
            return
        exchange = cycle.scope.get(EXCHANGE)
        if isinstance(exchange, Exchange) and exchange.on_disconnect is not None:
            callback, exchange.on_disconnect = exchange.on_disconnect, None
            callback()
