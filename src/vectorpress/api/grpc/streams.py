"""Ordered streams: many messages in flight, answers in request order, one bad slot ends it.

gRPC has no per-message status, so a failed message is reported the way TEI reports it: the
answers to every earlier message arrive in order, then the call ends with that message's status
code and error text. The other streams, and the server, go on as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from typing import TypeVar

Req = TypeVar("Req")
Res = TypeVar("Res")

_END = object()


async def ordered(
    requests: AsyncIterable[Req],
    handle: Callable[[Req], Awaitable[Res]],
    max_in_flight: int,
) -> AsyncIterator[Res]:
    """Run `handle` on each request as it arrives; yield the results in request order.

    At most `max_in_flight` messages are read and not yet answered: past that, reading waits,
    which pushes back on the client through gRPC flow control. An exception from `handle` (or
    from reading the requests) is raised here in its slot, after the earlier results.
    """
    slots = asyncio.Semaphore(max_in_flight)
    pending: asyncio.Queue[object] = asyncio.Queue()

    async def read() -> None:
        try:
            async for request in requests:
                await slots.acquire()
                pending.put_nowait(asyncio.ensure_future(handle(request)))
        except Exception as exc:  # a message that could not be read fails its own slot
            failed: asyncio.Future[Res] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            pending.put_nowait(failed)
        pending.put_nowait(_END)

    reader = asyncio.ensure_future(read())
    try:
        while True:
            item = await pending.get()
            if item is _END:
                break
            task: asyncio.Future[Res] = item  # type: ignore[assignment]
            result = await task
            slots.release()
            yield result
    finally:
        reader.cancel()
        while not pending.empty():
            item = pending.get_nowait()
            if not isinstance(item, asyncio.Future):
                continue
            if not item.done():
                item.cancel()
            elif not item.cancelled():
                item.exception()  # retrieved, so asyncio does not log it as lost
        with contextlib.suppress(BaseException):
            await reader
