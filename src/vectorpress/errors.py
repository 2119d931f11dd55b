"""The error tree and the one table that maps each error to the wire.

Every failure a caller can see is a :class:`VectorpressError`. Its class decides the HTTP
status, TEI's ``error_type``, the gRPC status code and the ``err`` label of
``te_request_failure``; messages say what the caller can change.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WireError:
    """How one kind of error appears on each wire."""

    http_status: int
    error_type: str
    grpc_code: str
    metric: str


class VectorpressError(Exception):
    """Base of every error a request can fail with."""

    wire = WireError(500, "Backend", "INTERNAL", "inference")

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.counted_as: str | None = None
        """The `err` label when the stage that failed decides it rather than the kind: TEI
        counts every error raised while tokenizing (empty input, token limit) as
        `tokenization`."""

    @property
    def http_status(self) -> int:
        return self.wire.http_status

    @property
    def error_type(self) -> str:
        return self.wire.error_type

    @property
    def grpc_code(self) -> str:
        return self.wire.grpc_code

    @property
    def metric(self) -> str:
        return self.counted_as or self.wire.metric

    def to_json(self) -> dict[str, object]:
        return {"error": self.message, "error_type": self.error_type}

    def to_openai(self) -> dict[str, object]:
        return {"message": self.message, "code": self.http_status, "type": self.error_type}


class EmptyError(VectorpressError):
    """An empty input, or an empty list of inputs."""

    wire = WireError(400, "Empty", "INVALID_ARGUMENT", "validation")


class ValidationError(VectorpressError):
    """A request that is well formed but asks for something the model cannot do."""

    wire = WireError(422, "Validation", "INVALID_ARGUMENT", "validation")


class BatchSizeError(ValidationError):
    """More inputs in one request than ``--max-client-batch-size``."""

    wire = WireError(422, "Validation", "INVALID_ARGUMENT", "batch_size")


class TokenLimitError(ValidationError):
    """An input over the token limit with truncation off (counted as tokenization, as TEI)."""

    wire = WireError(422, "Validation", "INVALID_ARGUMENT", "tokenization")


class TokenizerError(VectorpressError):
    """The tokenizer itself failed on an input."""

    wire = WireError(422, "Tokenizer", "FAILED_PRECONDITION", "tokenization")


class BackendError(VectorpressError):
    """The forward pass failed."""

    wire = WireError(424, "Backend", "FAILED_PRECONDITION", "inference")


class ModelTypeError(BackendError):
    """The route needs another kind of model than the one served."""

    wire = WireError(424, "Backend", "FAILED_PRECONDITION", "model_type")


class ModelNotFoundError(VectorpressError):
    """A request names a model this server does not serve."""

    wire = WireError(404, "NotFound", "NOT_FOUND", "validation")

    def __init__(self, name: str, served: tuple[str, ...] = ()) -> None:
        super().__init__(
            f"model {name!r} is not served here; the served models are: {', '.join(served)}"
        )
        self.name = name
        self.served = served

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), "models": list(self.served)}

    def to_openai(self) -> dict[str, object]:
        # OpenAI's clients read `code` as the reason; `param` names the field at fault.
        return {
            "message": self.message,
            "code": "model_not_found",
            "type": "invalid_request_error",
            "param": "model",
        }


class ModelConflictError(VectorpressError):
    """A request names two different served models (its path, `x-model` header or body)."""

    wire = WireError(400, "Validation", "INVALID_ARGUMENT", "validation")


class OverloadedError(VectorpressError):
    """No admission permit was free."""

    wire = WireError(429, "Overloaded", "RESOURCE_EXHAUSTED", "overloaded")

    def __init__(self, message: str = "Model is overloaded") -> None:
        super().__init__(message)


class UnhealthyError(VectorpressError):
    """The backend is not answering."""

    wire = WireError(503, "Unhealthy", "UNAVAILABLE", "inference")

    def __init__(self, message: str = "unhealthy") -> None:
        super().__init__(message)


class StartupError(Exception):
    """Start-up cannot go on; the message is printed as one line and the process exits 1."""


class JobError(StartupError):
    """A batch job cannot go on (an output folder holding another model's vectors, an input
    that cannot be read); printed as one line, the process exits 1."""
