"""Cancel a request's handler when its client disconnects, so its inputs never reach a batch.

Starlette lets a handler run to the end after the client has gone; for an embedding server that
means forward passes computed for nobody while live callers wait. Once the body has been read,
this middleware listens for `http.disconnect` and cancels the handler task; the cancellation
reaches the entries' futures, and the batching queue drops them before the forward pass.
"""

from __future__ import annotations

import asyncio
import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class DisconnectMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body_done = asyncio.Event()
        disconnected: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        response_started = False

        async def wrapped_receive() -> Message:
            if body_done.is_set():
                return await asyncio.shield(disconnected)
            message = await receive()
            if message["type"] == "http.disconnect":
                if not disconnected.done():
                    disconnected.set_result(message)
                body_done.set()
            elif not message.get("more_body", False):
                body_done.set()
            return message

        async def wrapped_send(message: Message) -> None:
            nonlocal response_started
            if message["type"] == "http.response.start":
                response_started = True
            await send(message)

        handler = asyncio.ensure_future(self.app(scope, wrapped_receive, wrapped_send))

        async def watch() -> None:
            await body_done.wait()
            if not disconnected.done():
                message = await receive()
                if message["type"] == "http.disconnect" and not disconnected.done():
                    disconnected.set_result(message)
            if not response_started and not handler.done():
                handler.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            await handler
        except asyncio.CancelledError:
            if not disconnected.done():
                raise  # cancelled from outside (shutdown), not by a disconnect
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
