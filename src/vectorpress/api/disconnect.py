"""Cancel a request's handler when its client disconnects, so its inputs never reach a batch.

Starlette lets a handler run to the end after the client has gone; for an embedding server that
means forward passes computed for nobody while live callers wait. Once the body has been read,
one task listens for `http.disconnect` and cancels the request's own task while no response has
started; the cancellation reaches the entries' futures, and the batching queue drops them before
the forward pass. The handler runs in the request's task rather than a task of its own: a second
task per request, and waiting for it, cost a tenth of a millisecond. Under this server's own
protocol the connection reports the disconnect itself (`Exchange.on_disconnect`), and no task
listens at all; elsewhere one task per request listens on `receive`.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vectorpress.api.protocol import EXCHANGE, Exchange


class DisconnectMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        task = asyncio.current_task()
        if scope["type"] != "http" or scope["method"] != "POST" or task is None:
            await self.app(scope, receive, send)
            return
        exchange = scope.get(EXCHANGE)
        listener = _Listener(
            receive, send, task, exchange if isinstance(exchange, Exchange) else None
        )
        try:
            await self.app(scope, listener.receive, listener.send)
        except asyncio.CancelledError:
            if not listener.cancelled:
                raise  # cancelled from outside (shutdown), not by a disconnect
            uncancel = getattr(task, "uncancel", None)  # Python 3.11+ counts cancellations
            if uncancel is not None:
                uncancel()
        finally:
            listener.close()


class _Listener:
    """The request's receive and send, watched for a disconnect once the body is in."""

    def __init__(
        self,
        receive: Receive,
        send: Send,
        task: asyncio.Task[object],
        exchange: Exchange | None = None,
    ) -> None:
        self._receive = receive
        self._send = send
        self._task = task
        self._exchange = exchange
        self._body_in = False
        self._disconnected: asyncio.Future[Message] | None = None
        """The watcher's answer, where a task listens (no exchange)."""
        self._watcher: asyncio.Task[None] | None = None
        self._started = False
        self.cancelled = False
        """Whether the request's task was cancelled here, for a disconnect."""

    async def receive(self) -> Message:
        if self._disconnected is not None:
            # After the body, the app listening for the client shares the watcher's answer.
            return await asyncio.shield(self._disconnected)
        message = await self._receive()
        if self._body_in:
            return message  # the connection reports the disconnect; the app reads on
        if message["type"] == "http.disconnect":
            self._body_in = True
            if self._exchange is None:
                self._disconnected = asyncio.get_running_loop().create_future()
                self._disconnected.set_result(message)
        elif not message.get("more_body", False):
            self._body_in = True
            if self._exchange is not None:
                self._exchange.on_disconnect = self._lost
            else:
                loop = asyncio.get_running_loop()
                self._disconnected = loop.create_future()
                self._watcher = loop.create_task(self._watch(self._disconnected))
        return message

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._started = True
        await self._send(message)

    async def _watch(self, disconnected: asyncio.Future[Message]) -> None:
        message = await self._receive()
        if message["type"] != "http.disconnect":
            return
        if not disconnected.done():
            disconnected.set_result(message)
        self._lost()

    def _lost(self) -> None:
        """The client is gone: cancel the request's task unless its answer has begun."""
        started = self._started or (self._exchange is not None and self._exchange.started)
        if not started and not self._task.done():
            self.cancelled = True
            self._task.cancel()

    def close(self) -> None:
        if self._exchange is not None:
            self._exchange.on_disconnect = None
        # Not awaited: a cancelled watcher only has to stop listening, nobody waits for it.
        if self._watcher is not None and not self._watcher.done():
            self._watcher.cancel()
