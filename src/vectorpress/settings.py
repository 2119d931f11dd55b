"""One frozen settings object: every operator knob, typed, defaulted and validated once.

Built at the edge (the CLI reads flags and environment variables) and passed explicitly;
library code never reads the environment for these values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

from vectorpress.errors import StartupError

DTYPES = ("float32", "float16", "bfloat16", "int8")
POOLINGS = ("cls", "mean", "splade", "last_token")
BACKENDS = ("auto", "torch", "hf", "onnx")
DEVICES = ("auto", "cpu", "cuda")


def default_tokenization_workers() -> int:
    # TEI uses cores - 1 so that one core stays free for the forward pass; clamped to 1..64.
    return max(1, min(64, (os.cpu_count() or 1) - 1))


@dataclass(frozen=True)
class Settings:
    """Everything an operator can set. Field docs are the CLI help text."""

    model_id: str
    """Hub repo id or local folder of the model."""
    revision: str | None = None
    """Hub branch, tag or commit; reported verbatim as `model_sha` in /info."""
    tokenization_workers: int = field(default_factory=default_tokenization_workers)
    """Threads that tokenize off the event loop."""
    dtype: str | None = None
    """float32, float16 or bfloat16; None picks the device's default (float32 on CPU)."""
    served_model_name: str | None = None
    """Name echoed by the OpenAI route and /info; defaults to the model id."""
    pooling: str | None = None
    """cls, mean, splade or last_token; overrides 1_Pooling/config.json."""
    max_concurrent_requests: int = 512
    """Admission permits; each input of a request takes one, and none free means 429."""
    max_batch_tokens: int = 16384
    """Token budget of one forward batch (padded cost for padded backends)."""
    max_batch_requests: int | None = None
    """Most inputs in one forward batch."""
    max_client_batch_size: int = 32
    """Most inputs in one request."""
    auto_truncate: bool = True
    """Default of a request's `truncate` when it omits it."""
    default_prompt_name: str | None = None
    """Key of config_sentence_transformers.json `prompts` prepended to every input by default."""
    default_prompt: str | None = None
    """Literal prompt prepended to every input by default."""
    dense_path: str | None = None
    """A sentence-transformers Dense module folder that replaces the single listed one."""
    hf_token: str | None = None
    """Hub token; never logged."""
    hostname: str = "0.0.0.0"
    """Address to bind."""
    port: int = 8080
    """HTTP port."""
    huggingface_hub_cache: str | None = None
    """Download cache folder."""
    payload_limit: int = 2_000_000
    """Largest HTTP request body in bytes."""
    api_key: str | None = None
    """Bearer key required on protected routes; never logged."""
    json_output: bool = False
    """One JSON object per log line."""
    disable_spans: bool = False
    """With JSON logs, leave out span fields."""
    otlp_endpoint: str | None = None
    """OTLP/gRPC trace collector, e.g. http://localhost:4317."""
    otlp_service_name: str = "text-embeddings-inference.server"
    """OpenTelemetry service.name."""
    prometheus_port: int | None = None
    """Also serve /metrics on this port when given."""
    cors_allow_origin: tuple[str, ...] | None = None
    """Allowed CORS origins; None or '*' allows any."""
    backend: str = "auto"
    """torch (native, packed), hf (transformers fallback), onnx, or auto."""
    device: str = "auto"
    """cpu, cuda, or auto (cuda when available)."""
    task: str | None = None
    """TASK (environment only, as TEI): `sentence-similarity` makes POST / and /invocations
    answer as /similarity for embedding models."""
    grpc_port: int | None = None
    """Also serve TEI's gRPC API (tei.v1, health, reflection) on this port when given."""
    grpc_max_parallel_stream_requests: int = 1024
    """Most messages of one gRPC stream read and not yet answered."""
    max_total_concurrent_requests: int | None = None
    """Admission permits across every served model (None: only each model's own)."""
    interactive_max_inputs: int = 32
    """A request with at most this many inputs, and at most `interactive_max_tokens` tokens in
    all, runs in the interactive lane unless it names its `priority`."""
    interactive_max_tokens: int = 2048
    """Most tokens (all inputs together) of a request that runs in the interactive lane by
    default."""
    bulk_pass_tokens: int | None = None
    """Most tokens of one bulk unit the scheduler runs (None: 4,096 on the CPU, the batch
    budget elsewhere)."""
    scheduler_weight: float = 1.0
    """This model's share of the device against the others' when all have bulk work."""
    preemption: bool = True
    """Run waiting interactive work between the layers of a bulk batch (torch backends)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise StartupError with one line naming the first bad value."""
        if not self.model_id:
            raise StartupError("--model-id is required: no default model package is installed")
        positive = {
            "tokenization-workers": self.tokenization_workers,
            "max-concurrent-requests": self.max_concurrent_requests,
            "max-batch-tokens": self.max_batch_tokens,
            "max-client-batch-size": self.max_client_batch_size,
            "payload-limit": self.payload_limit,
            "grpc-max-parallel-stream-requests": self.grpc_max_parallel_stream_requests,
        }
        if self.max_batch_requests is not None:
            positive["max-batch-requests"] = self.max_batch_requests
        positive["interactive-max-inputs"] = self.interactive_max_inputs
        positive["interactive-max-tokens"] = self.interactive_max_tokens
        for name, optional in (
            ("max-total-concurrent-requests", self.max_total_concurrent_requests),
            ("bulk-pass-tokens", self.bulk_pass_tokens),
        ):
            if optional is not None:
                positive[name] = optional
        for name, value in positive.items():
            if value <= 0:
                raise StartupError(f"--{name} must be a positive integer, got {value}")
        for name, port in (
            ("port", self.port),
            ("prometheus-port", self.prometheus_port),
            ("grpc-port", self.grpc_port),
        ):
            if port is not None and not 0 <= port <= 65535:
                raise StartupError(f"--{name} must be between 0 and 65535, got {port}")
        if not self.scheduler_weight > 0:
            raise StartupError(
                f"--scheduler-weight must be a positive number, got {self.scheduler_weight}"
            )
        if self.dtype is not None and self.dtype not in DTYPES:
            raise StartupError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise StartupError(
                f"--pooling must be one of cls, mean, splade, last-token, got {self.pooling!r}"
            )
        if self.backend not in BACKENDS:
            raise StartupError(
                f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}"
            )
        if self.device not in DEVICES:
            raise StartupError(f"--device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.default_prompt is not None and self.default_prompt_name is not None:
            raise StartupError("--default-prompt and --default-prompt-name cannot both be set")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_id

    def redacted(self) -> dict[str, object]:
        """The settings as a dict fit for logs: secrets replaced."""
        out: dict[str, object] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("hf_token", "api_key") and value is not None:
                value = "<redacted>"
            out[f.name] = value
        return out
