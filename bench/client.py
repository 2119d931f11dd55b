"""A lean HTTP/1.1 client for the load tests: one kept-alive connection per concurrent worker.

The client shares the machine's two cores with the server under test, so what it spends per
request is taken from that server. httpx's AsyncClient with 64 connections spent 15-18 ms of CPU
per one-text request here, more than the server did (it held vectorpress to about 45 requests a
second; with this client, at 0.14 ms per request, the same server answered 215). This one writes
the request in one piece and reads the reply by its Content-Length (or chunks), nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import subprocess
import time
import urllib.parse

import orjson


class Connection:
    """One kept-alive connection; reopened when the server closes it."""

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, payload: object) -> tuple[int, bytes]:
        """POST `payload` as JSON; the status and the body."""
        body = orjson.dumps(payload)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        self._writer.write(head + body)
        status, headers = _head(await self._reader.readuntil(b"\r\n\r\n"))
        if headers.get("transfer-encoding", "").lower() == "chunked":
            content = await self._chunks()
        else:
            content = await self._reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, content

    async def _chunks(self) -> bytes:
        assert self._reader is not None
        parts = []
        while True:
            size = int((await self._reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await self._reader.readuntil(b"\r\n")  # no trailers from these servers
                return b"".join(parts)
            parts.append(await self._reader.readexactly(size))
            await self._reader.readexactly(2)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None


class BlockingConnection:
    """The same for one request at a time, with no event loop: the short-query latency.

    The standard library's http.client, used before, parses each reply's headers with the email
    package; this reads them as the asyncio client does.
    """

    def __init__(self, url: str) -> None:
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self._sock: socket.socket | None = None
        self._buffer = b""

    def post_raw(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST an already encoded JSON body; the status and the body."""
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        ).encode()
        if self._sock is None:
            self._sock = socket.create_connection((self.host, self.port))
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._buffer = b""
        self._sock.sendall(head + body)
        status, headers = _head(self._read_until(b"\r\n\r\n"))
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while size := int(self._read_until(b"\r\n").split(b";")[0], 16):
                parts.append(self._read_exactly(size))
                self._read_exactly(2)
            self._read_until(b"\r\n")
            content = b"".join(parts)
        else:
            content = self._read_exactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, content

    def _fill(self) -> None:
        assert self._sock is not None
        data = self._sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self._buffer += data

    def _read_until(self, marker: bytes) -> bytes:
        while (end := self._buffer.find(marker)) < 0:
            self._fill()
        end += len(marker)
        out, self._buffer = self._buffer[:end], self._buffer[end:]
        return out

    def _read_exactly(self, n: int) -> bytes:
        while len(self._buffer) < n:
            self._fill()
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None


def _head(raw: bytes) -> tuple[int, dict[str, str]]:
    """The status and the lower-cased headers of a reply's head."""
    lines = raw.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    headers = {}
    for line in lines[1:]:
        if line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return status, headers


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for a server a benchmark starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(
    name: str, url: str, proc: subprocess.Popen[bytes], log: str, timeout: float, poll: float
) -> None:
    """Return once `url`/health answers 200; raise if `proc` exits first or `timeout` passes."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: see {log}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(poll)
    raise RuntimeError(f"{name} not ready after {timeout}s: see {log}")


def metric_sums(url: str, names: tuple[str, ...]) -> list[float]:
    """The sums over every series of each named metric on a vectorpress server's /metrics."""
    import httpx

    text = httpx.get(f"{url}/metrics", timeout=30).text
    out = [0.0] * len(names)
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        for i, name in enumerate(names):
            if series == name or series.startswith(name + "{"):
                out[i] += float(value)
    return out


def inference_seconds(url: str) -> tuple[float, int]:
    """The server's te_request_inference_duration sum and count."""
    total, count = metric_sums(
        url, ("te_request_inference_duration_sum", "te_request_inference_duration_count")
    )
    return total, int(count)


def mean_inference(url: str, before: tuple[float, int]) -> float:
    """The server's own mean inference time per request since `before` (`inference_seconds`
    then). Read once around a block of timed queries rather than after each: a /metrics answer
    between two queries (about a millisecond of the server's Python) left the next query with
    cold caches: on OpenVINO fp32, three alternated rounds gave a short query's overhead as
    1.01-1.08 ms that way against 0.71-0.77 ms this way."""
    total, count = inference_seconds(url)
    done = count - before[1]
    return (total - before[0]) / done if done > 0 else math.nan


def server_overhead(latencies: list[float], url: str, before: tuple[float, int]) -> float:
    """Seconds a request spent outside the server's inference: the mean of `latencies` (the
    requests since `before`, one at a time) minus the server's mean inference time over the
    same requests. Means on both sides: the p50 of the latencies less the mean inference made
    a run whose few slow requests were slow inside the forward (p99 29 ms) read 0.18 ms where
    the runs around it read 0.6-0.7."""
    return sum(latencies) / len(latencies) - mean_inference(url, before)
