"""What every route handler reaches through the request: the served models and the settings."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import Request

from vectorpress import __version__
from vectorpress.core.infer import Infer
from vectorpress.core.metrics import Registry
from vectorpress.core.models import Models
from vectorpress.settings import ModelSettings, ServerSettings

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer


@dataclass
class ModelState:
    """One served model as the API sees it: its pipeline, its settings, what it runs on."""

    infer: Infer
    settings: ModelSettings
    server: ServerSettings
    backend_name: str = ""
    dtype: str = "float32"
    device: str = "cpu"

    @property
    def name(self) -> str:
        return self.settings.model_name

    @property
    def names(self) -> tuple[str, ...]:
        return self.settings.names

    def info(self) -> dict[str, Any]:
        """/info, with TEI's fields in TEI's order."""
        spec = self.infer.spec
        queue = self.infer.queue
        return {
            "model_id": self.settings.model_id,
            "model_sha": self.settings.revision,
            "model_dtype": self.dtype,
            "served_model_name": self.settings.model_name,
            "model_type": spec.info_model_type(),
            "max_concurrent_requests": self.server.max_concurrent_requests,
            "max_input_length": spec.max_input_length,
            "max_batch_tokens": queue.max_batch_tokens,
            "max_batch_requests": queue.max_batch_requests,
            "max_client_batch_size": self.settings.max_client_batch_size,
            "auto_truncate": self.settings.auto_truncate,
            "tokenization_workers": self.infer.tokenizers.workers,
            "version": __version__,
            "sha": None,
            "docker_label": None,
            # After TEI's fields, which keep TEI's order: the default of a request's
            # `windowed` (long inputs as pooled windows), false where outputs never window.
            "windowed_inputs": self.settings.windowed_inputs and spec.windows,
            "window_overlap": self.settings.window_overlap,
        }


@dataclass
class AppState:
    """The whole server: its settings, the served models (the first is the default) and the
    one metrics registry they share."""

    server: ServerSettings
    models: Models[ModelState]
    registry: Registry = field(default_factory=Registry)
    tracer: Tracer | None = None
    """Set when --otlp-endpoint is given; None means no span is ever created."""
    created: int = field(default_factory=lambda: int(time.time()))
    """When the models were loaded, as OpenAI's model objects give it (Unix seconds)."""

    @classmethod
    def single(cls, model: ModelState) -> AppState:
        return cls(model.server, Models([model]), model.infer.metrics.registry, model.infer.tracer)

    @property
    def default(self) -> ModelState:
        return self.models.default


def get_state(request: Request) -> AppState:
    return request.app.state.vp
