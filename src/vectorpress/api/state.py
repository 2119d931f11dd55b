"""What every route handler reaches through the request: the Infer object and settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import Request

from vectorpress import __version__
from vectorpress.core.infer import Infer
from vectorpress.settings import ModelSettings, ServerSettings


@dataclass
class AppState:
    infer: Infer
    settings: ModelSettings
    server: ServerSettings
    backend_name: str = ""
    dtype: str = "float32"
    device: str = "cpu"

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
        }


def get_state(request: Request) -> AppState:
    return request.app.state.vp
