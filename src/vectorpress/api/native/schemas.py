"""Request bodies of TEI's routes. Unknown fields are ignored, as TEI does."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from vectorpress.api.encodings import Dtype
from vectorpress.core.tokenization import PairInput
from vectorpress.errors import ValidationError
from vectorpress.types import Truncation

TokenId = Annotated[StrictInt, Field(ge=0, le=2**32 - 1)]
#: One input: a text, or the token ids of one text.
InputItem = StrictStr | list[TokenId]
#: A single input (tried first, so a flat id list is one input) or a batch of them.
Input = StrictStr | list[TokenId] | list[InputItem]
Direction = Literal["Left", "left", "Right", "right"]
#: "text", ["text"], ["query", "passage"], or a batch [["text"], ["query", "passage"], ...].
PredictInput = StrictStr | list[StrictStr] | list[list[StrictStr]]


def to_truncation(direction: str) -> Truncation:
    return Truncation.LEFT if direction.lower() == "left" else Truncation.RIGHT


def as_batch(inputs: Input) -> tuple[list[str | list[int]], bool]:
    """The inputs as a list, and whether the request gave a batch."""
    if isinstance(inputs, str):
        return [inputs], False
    if not inputs or all(isinstance(i, int) for i in inputs):
        return [list(inputs)], False  # type: ignore[arg-type]
    return list(inputs), True  # type: ignore[arg-type]


def _sequence(items: list[str]) -> PairInput:
    if len(items) == 1:
        return items[0]
    if len(items) == 2:
        return (items[0], items[1])
    raise ValidationError(
        "Failed to deserialize the JSON body into the target type: inputs: a sequence has "
        f"{len(items)} texts; give one text or a pair of two"
    )


def predict_batch(inputs: PredictInput) -> tuple[list[PairInput], bool]:
    """The texts and pairs to score, and whether the request gave a batch.

    As in TEI, a flat list of one or two strings is one input (a text or a pair) and a list of
    lists is a batch.
    """
    if isinstance(inputs, str):
        return [inputs], False
    if not inputs:
        return [], True
    if all(isinstance(i, str) for i in inputs):
        return [_sequence(inputs)], False  # type: ignore[arg-type]
    return [_sequence(i) for i in inputs], True  # type: ignore[arg-type]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: StrictStr | None = None
    """Which served model answers (its name or an alias); the default model when absent."""


#: Which lane a request's inputs wait in; absent, its size decides (see LanePolicy). vLLM's
#: clients send an integer (lower runs earlier, 0 by default), so one is taken too: below 0 is
#: interactive, above 0 bulk, and 0 leaves the choice to the request's size or header.
Priority = Literal["interactive", "bulk"] | StrictInt


def lane_name(priority: Priority | None, header: str | None) -> str | None:
    """The lane a body's `priority` names, else the `x-priority` header's."""
    if isinstance(priority, int):
        return "interactive" if priority < 0 else "bulk" if priority > 0 else header
    return priority or header


class Prioritized(_Body):
    """A body that may name its lane; `priority` overrides the `x-priority` header."""

    priority: Priority | None = None

    def lane(self, header: str | None) -> str | None:
        return lane_name(self.priority, header)


def _example(example: dict[str, Any]) -> ConfigDict:
    """Unknown fields ignored, and an example request for /docs."""
    return ConfigDict(extra="ignore", json_schema_extra={"examples": [example]})


class EmbedRequest(Prioritized):
    model_config = _example(
        {"inputs": ["What is Deep Learning?", "Deep learning is a part of machine learning."]}
    )

    inputs: Input
    truncate: StrictBool | None = None
    truncation_direction: Direction = "Right"
    prompt_name: StrictStr | None = None
    normalize: StrictBool = True
    dimensions: StrictInt | None = None
    windowed: StrictBool | None = None
    """Embed a text longer than the model's window as pooled overlapping windows (the
    server's --windowed-inputs when omitted)."""
    window_overlap: StrictInt | None = None
    """Tokens consecutive windows share (the server's --window-overlap when omitted)."""


class EmbedAllRequest(Prioritized):
    model_config = _example({"inputs": "What is Deep Learning?"})

    inputs: Input
    truncate: StrictBool | None = None
    truncation_direction: Direction = "Right"
    prompt_name: StrictStr | None = None


class EmbedSparseRequest(EmbedAllRequest):
    pass


class EmbedMultiRequest(Prioritized):
    model_config = _example(
        {"inputs": ["What is BGE M3?"], "dense": True, "sparse": True, "colbert": True}
    )

    inputs: Input
    dense: StrictBool = False
    sparse: StrictBool = False
    colbert: StrictBool = True
    normalize: StrictBool = True
    """Normalize the dense vector (per-token vectors always are, as the models train them)."""
    encoding_format: Literal["float", "base64"] = "float"
    """base64: each output as one object `{base64, shape, dtype}`, the base64 of its
    little-endian array in `dtype` (a text's per-token vectors row after row)."""
    dtype: Dtype = "float32"
    """The value type (api/encodings.py, as the dialects' `embed_dtype`): float32, float16,
    bfloat16, binary or ubinary (packed sign bits: `shape` counts bytes); int8 and uint8 for a
    bge-m3 dense vector only (their ranges are calibrated on pooled vectors)."""
    is_query: StrictBool = True
    """ColBERT: encode as queries (prefix, expansion to the query length) or documents."""
    truncate: StrictBool | None = None
    truncation_direction: Direction = "Right"
    prompt_name: StrictStr | None = None
    windowed: StrictBool | None = None
    """Refused when true: per-token vectors are not windowed (split a long document into
    passages); the server's --windowed-inputs does not apply here."""


class SimilarityInput(_Body):
    source_sentence: StrictStr
    sentences: list[StrictStr]


class SimilarityParameters(_Body):
    truncate: StrictBool | None = None
    truncation_direction: Direction = "Right"
    prompt_name: StrictStr | None = None


class SimilarityRequest(Prioritized):
    model_config = _example(
        {
            "inputs": {
                "source_sentence": "What is Deep Learning?",
                "sentences": [
                    "Deep learning is a part of machine learning.",
                    "Cheese is made from milk.",
                ],
            }
        }
    )

    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


class PredictRequest(Prioritized):
    model_config = _example({"inputs": [["I like you."], ["Is it raining?", "It is sunny."]]})

    inputs: PredictInput
    truncate: StrictBool | None = None
    truncation_direction: Direction = "Right"
    raw_scores: StrictBool = False


class RerankRequest(Prioritized):
    model_config = _example(
        {
            "query": "What is Deep Learning?",
            "texts": ["Deep Learning is not...", "Deep learning is..."],
        }
    )

    query: StrictStr
    texts: list[StrictStr]
    truncate: StrictBool | None = None
    truncation_direction: Direction = "Right"
    raw_scores: StrictBool = False
    return_text: StrictBool = False
    weights: list[float] | None = None
    """bge-m3 only: the weights of its dense, sparse and ColBERT scores."""
    windowed: StrictBool | None = None
    """Cross-encoders: score a text too long for the window by its best window."""
    window_overlap: StrictInt | None = None


class TokenizeRequest(_Body):
    model_config = _example({"inputs": "test"})

    inputs: StrictStr | list[StrictStr]
    add_special_tokens: StrictBool = True
    prompt_name: StrictStr | None = None


class DecodeRequest(_Body):
    model_config = _example({"ids": [101, 3231, 102]})

    ids: list[TokenId] | list[list[TokenId]]
    skip_special_tokens: StrictBool = True


class VertexRequest(_Body):
    model_config = _example({"instances": [{"inputs": "What is Deep Learning?"}]})

    instances: list[dict[str, Any]]
