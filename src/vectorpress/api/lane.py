"""The app the server runs: FastAPI, with a shorter way in for the inference routes' POSTs.

Starlette wraps every request in the app's whole middleware stack: FastAPI's own call (its
telemetry check reads the OpenTelemetry providers), Starlette's, the server-error layer,
FastAPI's exception telemetry and body limit, CORS, and only then this server's layers. For a
POST to an inference route with no `Origin` header, no tracing and no OpenTelemetry provider,
all but the server-error layer pass it through untouched, and each costs a few Python calls
with the caches cold from the last pass. Such a request goes from the server-error layer
straight to the first of this server's own (`PrefixRouting`): the same instances, in the same
order, as the full stack has them. Everything else takes the full stack. (With the metrics'
batched recording, the event loop's CPU per short query went 550 -> 535 us, alternated rounds.)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import FastAPI
from starlette.middleware.cors import CORSMiddleware
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from vectorpress.api.protocol import EXCHANGE, Exchange
from vectorpress.api.routing import PREFIX, PrefixRouting


class LanedApp(FastAPI):
    """FastAPI whose inference POSTs skip the layers that would not touch them."""

    def __init__(self, *args: Any, lane_paths: Iterable[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lane_paths = frozenset(lane_paths)
        """Paths that take the lane; every path under `/models/` does too (PrefixRouting's
        to rewrite; a non-inference one goes on to FastAPI's router there, as in the stack)."""
        self._lane: ASGIApp | None = None
        self._telemetry: Any = None
        """FastAPI's own telemetry (read once, with the stack); None where it has none."""
        self._telemetry_unset: Callable[[], bool] | None = None

    @property
    def laned(self) -> bool:
        """Whether the lane exists (built with the stack, on the first request)."""
        return self._lane is not None

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        self._lane = self._build_lane(stack)
        self._telemetry = getattr(self, "_native_telemetry", None)
        self._telemetry_unset = _providers_unset(self._telemetry)
        return stack

    def _build_lane(self, stack: ASGIApp) -> ASGIApp | None:
        """The server-error layer (it turns what escapes into the app's 500 answer) around
        the stack's own PrefixRouting; None where a layer outside PrefixRouting may act on
        the lane's requests."""
        outside: list[Any] = [m.cls for m in self.user_middleware]  # outermost first
        if PrefixRouting not in outside or getattr(self, "max_body_size", None) is not None:
            return None
        # CORS leaves a request without Origin alone (checked per request); anything else
        # (the tracing layer) must see every request.
        if any(cls is not CORSMiddleware for cls in outside[: outside.index(PrefixRouting)]):
            return None
        if not isinstance(stack, ServerErrorMiddleware):
            return None
        first: Any = stack
        while first is not None and not isinstance(first, PrefixRouting):
            first = getattr(first, "app", None)
        if first is None:
            return None
        return ServerErrorMiddleware(first, handler=stack.handler, debug=stack.debug)

    def _takes_lane(self, scope: Scope) -> bool:
        if scope["type"] != "http" or scope["method"] != "POST":
            return False
        path: str = scope["path"]
        if path not in self.lane_paths and not path.startswith(PREFIX):
            return False
        for name, _ in scope["headers"]:
            if name == b"origin":
                return False
        # FastAPI's own OpenTelemetry instrumentation, where a provider is configured.
        telemetry = self._telemetry
        if telemetry is None:
            return True
        unset = self._telemetry_unset
        return (unset is not None and unset()) or not telemetry.enabled()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.middleware_stack is None:
            self.middleware_stack = self.build_middleware_stack()
        lane = self._lane
        if lane is None or not self._takes_lane(scope):
            await super().__call__(scope, receive, send)
            return
        if self.root_path:
            scope["root_path"] = self.root_path
        scope["app"] = self
        exchange = scope.get(EXCHANGE)
        if isinstance(exchange, Exchange):
            exchange.bare = True
        await lane(scope, receive, send)


#: Variables that name an OpenTelemetry provider for its API to load on first use.
_PROVIDER_VARIABLES = (
    "OTEL_PYTHON_TRACER_PROVIDER",
    "OTEL_PYTHON_METER_PROVIDER",
    "OTEL_PYTHON_LOGGER_PROVIDER",
)


def _providers_unset(telemetry: Any) -> Callable[[], bool] | None:
    """A test that FastAPI's telemetry is off because no OpenTelemetry provider exists at all:
    three module attributes read, where its own `enabled()` makes about twenty Python calls
    (each provider's getter reads the environment). True only where `enabled()` would say
    False; where it says nothing (a provider is set) `enabled()` decides. None where this test
    does not hold: a provider given to FastAPI itself, a provider variable in the environment
    when the stack was built, or an OpenTelemetry without these module attributes.
    """
    if telemetry is None:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry._logs import _internal as logs
        from opentelemetry.metrics import _internal as metrics
    except ImportError:
        return None
    config = getattr(telemetry, "config", None)
    if not isinstance(config, dict):
        return None
    if any(
        config.get(key) is not None
        for key in ("tracer_provider", "meter_provider", "logger_provider")
    ):
        return None
    if any(name in os.environ for name in _PROVIDER_VARIABLES):
        return None
    found = (
        hasattr(trace, "_TRACER_PROVIDER")
        and hasattr(metrics, "_METER_PROVIDER")
        and hasattr(logs, "_LOGGER_PROVIDER")
    )
    if not found:
        return None

    def unset() -> bool:
        return (
            trace._TRACER_PROVIDER is None
            and metrics._METER_PROVIDER is None
            and logs._LOGGER_PROVIDER is None
        )

    return unset
