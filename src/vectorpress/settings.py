"""Frozen settings in two scopes: the server's, and one per served model.

Built at the edge (the CLI reads flags, environment variables and `--config`) and passed
explicitly; library code never reads the environment for these values. Each object validates
itself once, when it is made, and raises StartupError with one line naming the first bad value.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from vectorpress.cpus import available_cpus
from vectorpress.errors import StartupError

DTYPES = ("float32", "float16", "bfloat16", "int8", "auto")
POOLINGS = ("cls", "mean", "splade", "last_token")
BACKENDS = ("auto", "torch", "hf", "onnx", "openvino")
DEVICES = ("auto", "cpu", "cuda")

#: Fields whose values never appear in logs.
SECRETS = ("hf_token", "api_key")


def default_tokenization_workers() -> int:
    # TEI uses cores - 1 so that one core stays free for the forward pass; clamped to 1..64.
    return max(1, min(64, available_cpus() - 1))


def _positive(values: dict[str, int | None], where: str = "") -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise StartupError(f"{where}--{name} must be a positive integer, got {value}")


def _redacted(obj: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for f in fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        if f.name in SECRETS and value is not None:
            value = "<redacted>"
        out[f.name] = value
    return out


@dataclass(frozen=True)
class ServerSettings:
    """What the whole process shares: listeners, keys, limits, telemetry. Field docs are the
    CLI help text."""

    hostname: str = "0.0.0.0"
    """Address to bind."""
    port: int = 8080
    """HTTP port."""
    api_key: str | None = None
    """Bearer key required on protected routes; never logged."""
    cors_allow_origin: tuple[str, ...] | None = None
    """Allowed CORS origins; None or '*' allows any."""
    payload_limit: int = 2_000_000
    """Largest HTTP request body in bytes."""
    max_concurrent_requests: int = 512
    """Admission permits of each model; each input of a request takes one, none free is 429."""
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
    preemption: bool = True
    """Run waiting interactive work between the layers of a bulk batch (torch backends)."""
    device_runners: int = 0
    """Units run side by side on the CPU, each on its share of the intra-op threads, where
    every model's backend can (the torch backend on the CPU; `core/scheduler.py`); 0: two where
    the process has two threads or more, 1: one unit at a time."""

    def __post_init__(self) -> None:
        _positive(
            {
                "max-concurrent-requests": self.max_concurrent_requests,
                "payload-limit": self.payload_limit,
                "grpc-max-parallel-stream-requests": self.grpc_max_parallel_stream_requests,
                "max-total-concurrent-requests": self.max_total_concurrent_requests,
                "interactive-max-inputs": self.interactive_max_inputs,
                "interactive-max-tokens": self.interactive_max_tokens,
            }
        )
        for name, port in (
            ("port", self.port),
            ("prometheus-port", self.prometheus_port),
            ("grpc-port", self.grpc_port),
        ):
            if port is not None and not 0 <= port <= 65535:
                raise StartupError(f"--{name} must be between 0 and 65535, got {port}")
        if self.device_runners < 0:
            raise StartupError(
                f"--device-runners must be 0 (auto) or more, got {self.device_runners}"
            )

    def redacted(self) -> dict[str, object]:
        return _redacted(self)


@dataclass(frozen=True)
class ModelSettings:
    """What one served model is and how it runs. Field docs are the CLI help text."""

    model_id: str
    """Hub repo id or local folder of the model."""
    revision: str | None = None
    """Hub branch, tag or commit; reported verbatim as `model_sha` in /info."""
    served_model_name: str | None = None
    """Name clients route by, echoed by the OpenAI route and /info; defaults to the model id."""
    aliases: tuple[str, ...] = ()
    """Further names clients may route by."""
    hf_token: str | None = None
    """Hub token; never logged."""
    huggingface_hub_cache: str | None = None
    """Download cache folder (exported ONNX graphs are cached beside the downloads)."""
    backend: str = "auto"
    """torch (native, packed), hf (transformers fallback), onnx, openvino, or auto."""
    device: str = "auto"
    """cpu, cuda, or auto (cuda when available)."""
    dtype: str | None = None
    """float32, float16, bfloat16, int8 or auto; None picks the device's default (float32 on
    CPU); auto: bfloat16 on a CPU that multiplies it natively if the model's vectors hold it
    (`backends/dtype_choice.py`), else as None."""
    cuda_graphs: bool = True
    """On a GPU, replay the native encoder's forward from CUDA graphs where the model allows."""
    pooling: str | None = None
    """cls, mean, splade or last_token; overrides 1_Pooling/config.json."""
    dense_path: str | None = None
    """A sentence-transformers Dense module folder that replaces the single listed one."""
    default_prompt_name: str | None = None
    """Key of config_sentence_transformers.json `prompts` prepended to every input by default."""
    default_prompt: str | None = None
    """Literal prompt prepended to every input by default."""
    max_batch_tokens: int = 16384
    """Token budget of one forward batch (padded cost for padded backends)."""
    max_batch_requests: int | None = None
    """Most inputs in one forward batch."""
    bulk_pass_tokens: int | None = None
    """Most tokens of one bulk unit the scheduler runs (None: 4,096 on the CPU, the batch
    budget elsewhere)."""
    scheduler_weight: float = 1.0
    """This model's share of the device against the others' when all have bulk work."""
    max_client_batch_size: int = 32
    """Most inputs in one request."""
    auto_truncate: bool = True
    """Default of a request's `truncate` when it omits it."""
    tokenization_workers: int = field(default_factory=default_tokenization_workers)
    """Threads that tokenize this model's inputs off the event loop."""
    task: str | None = None
    """TASK (environment only, as TEI): `sentence-similarity` makes POST / and /invocations
    answer as /similarity for embedding models."""
    windowed_inputs: bool = False
    """Default of a request's `windowed`: an input longer than the model's window is embedded
    as overlapping windows whose vectors are pooled (token-weighted mean), not truncated."""
    window_overlap: int = 0
    """Tokens each window shares with the one before it."""
    llm_reranker: bool | None = None
    """Serve a *ForCausalLM checkpoint as a reranker scored by its answer tokens' logits; by
    default one is when its model id or folder name contains `rerank` (Qwen3-Reranker)."""
    reranker_prefix: str | None = None
    """LLM reranker: fixed text before each pair, tokenized apart (default Qwen3-Reranker's)."""
    reranker_template: str | None = None
    """LLM reranker: the pair's text, with {query}, {document} and optionally {instruction}."""
    reranker_suffix: str | None = None
    """LLM reranker: fixed text after each pair, where the answer token would come."""
    reranker_instruction: str | None = None
    """LLM reranker: the {instruction} of the template."""
    reranker_tokens: str | None = None
    """LLM reranker: `yes,no`: score P(yes) over the two answer tokens; one token: its logit
    through a sigmoid (bge-reranker-v2-gemma's `Yes`)."""

    def __post_init__(self) -> None:
        if not self.model_id:
            raise StartupError("--model-id is required: no default model package is installed")
        where = "" if self.served_model_name is None else f"model {self.served_model_name}: "
        _positive(
            {
                "tokenization-workers": self.tokenization_workers,
                "max-batch-tokens": self.max_batch_tokens,
                "max-client-batch-size": self.max_client_batch_size,
                "max-batch-requests": self.max_batch_requests,
                "bulk-pass-tokens": self.bulk_pass_tokens,
            },
            where,
        )
        if not self.scheduler_weight > 0:
            raise StartupError(
                f"{where}--scheduler-weight must be a positive number, got {self.scheduler_weight}"
            )
        if self.dtype is not None and self.dtype not in DTYPES:
            raise StartupError(
                f"{where}--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}"
            )
        if self.pooling is not None and self.pooling not in POOLINGS:
            raise StartupError(
                f"{where}--pooling must be one of cls, mean, splade, last-token, "
                f"got {self.pooling!r}"
            )
        if self.backend not in BACKENDS:
            raise StartupError(
                f"{where}--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}"
            )
        if self.device not in DEVICES:
            raise StartupError(
                f"{where}--device must be one of {', '.join(DEVICES)}, got {self.device!r}"
            )
        if self.default_prompt is not None and self.default_prompt_name is not None:
            raise StartupError(
                f"{where}--default-prompt and --default-prompt-name cannot both be set"
            )
        if self.window_overlap < 0:
            raise StartupError(f"{where}--window-overlap must be >= 0, got {self.window_overlap}")
        template = self.reranker_template
        if template is not None and ("{query}" not in template or "{document}" not in template):
            raise StartupError(
                f"{where}--reranker-template must contain {{query}} and {{document}}, "
                f"got {template!r}"
            )
        if self.reranker_tokens is not None:
            tokens = [t for t in self.reranker_tokens.split(",") if t]
            if not 1 <= len(tokens) <= 2:
                raise StartupError(
                    f"{where}--reranker-tokens must be one token or `yes,no`, "
                    f"got {self.reranker_tokens!r}"
                )
        for name in self.names:
            if not name.strip() or name != name.strip():
                raise StartupError(
                    f"{where}model names and aliases must be non-empty, without outer spaces, "
                    f"got {name!r}"
                )

    @property
    def model_name(self) -> str:
        """The name clients see and route by."""
        return self.served_model_name or self.model_id

    @property
    def names(self) -> tuple[str, ...]:
        """Every name this model answers to: its served name, then its aliases."""
        return (self.model_name, *self.aliases)

    def redacted(self) -> dict[str, object]:
        return _redacted(self)


_SERVER_FIELDS = frozenset(f.name for f in fields(ServerSettings))
_MODEL_FIELDS = frozenset(f.name for f in fields(ModelSettings))


@dataclass(frozen=True)
class Settings:
    """The whole process: the server's settings and the models it serves, the first being the
    default one (what a request that names no model gets)."""

    server: ServerSettings
    models: tuple[ModelSettings, ...]

    def __post_init__(self) -> None:
        if not self.models:
            raise StartupError("no model to serve: give --model-id or --config")
        seen: dict[str, str] = {}
        for model in self.models:
            for name in model.names:
                if name in seen:
                    raise StartupError(
                        f"two models are named {name!r} ({seen[name]} and {model.model_id}); "
                        "give each its own served name"
                    )
                seen[name] = model.model_id

    @classmethod
    def single(cls, model_id: str, **values: Any) -> Settings:
        """One model: keyword arguments of either scope, each sent where it belongs."""
        unknown = set(values) - _SERVER_FIELDS - _MODEL_FIELDS
        if unknown:
            raise TypeError(f"unknown settings: {', '.join(sorted(unknown))}")
        server = ServerSettings(**{k: v for k, v in values.items() if k in _SERVER_FIELDS})
        model = ModelSettings(model_id, **{k: v for k, v in values.items() if k in _MODEL_FIELDS})
        return cls(server, (model,))

    @property
    def model(self) -> ModelSettings:
        """The default (first) model's settings."""
        return self.models[0]

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret value set, for log redaction."""
        values = [self.server.api_key, *(m.hf_token for m in self.models)]
        return tuple(v for v in values if v)

    def redacted(self) -> dict[str, object]:
        """The settings as a dict fit for logs: secrets replaced."""
        return {
            "server": self.server.redacted(),
            "models": [m.redacted() for m in self.models],
        }


def model_fields() -> frozenset[str]:
    """The names a model's table in a `--config` file may use."""
    return _MODEL_FIELDS


def server_fields() -> frozenset[str]:
    return _SERVER_FIELDS
