"""Cohere's request bodies (v1 and v2). Unknown fields are ignored, as Cohere's API does.

`/v1/rerank` and `/v2/rerank` are also Jina's and vLLM's rerank routes: their bodies are the same
fields, so one body type takes all of them (`use_activation` is vLLM's)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from vectorpress.api.native.schemas import Priority

InputType = Literal["search_document", "search_query", "classification", "clustering", "image"]
Truncate = Literal["NONE", "START", "END"]


class RerankBody(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "model": "rerank-v3.5",
                    "query": "What is Deep Learning?",
                    "documents": ["Deep learning is...", "Cheese is made from milk."],
                    "top_n": 1,
                }
            ]
        },
    )

    query: StrictStr
    documents: list[StrictStr | dict[str, Any]] = Field(
        description="Texts, or objects with a `text` field (with `rank_fields`, any fields)"
    )
    model: StrictStr | None = None
    top_n: StrictInt | None = Field(None, description="How many results, best first; all if absent")
    return_documents: StrictBool | None = Field(
        None, description="Echo each result's document (Cohere v1, Jina); off by default"
    )
    rank_fields: list[StrictStr] | None = Field(
        None, description="Cohere v1: fields of object documents to rank on, in order"
    )
    max_tokens_per_doc: StrictInt | None = Field(
        None, description="Cohere v2: cut each document after this many tokens"
    )
    use_activation: StrictBool | None = Field(
        None, description="vLLM: false answers the model's raw scores instead of sigmoid"
    )
    max_chunks_per_doc: StrictInt | None = Field(
        None,
        description="Cohere v1: score a document too long for the model's window by its best "
        "window (the query whole in each, windows sharing --window-overlap tokens), of at most "
        "this many first windows; cross-encoders only (absent: the server's --windowed-inputs)",
    )
    priority: Priority | None = Field(
        None, description="Extension: the lane (interactive or bulk); overrides `x-priority`"
    )


class EmbedContent(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: StrictStr


class EmbedInput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    content: list[EmbedContent]


class EmbedBody(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {
                    "model": "embed-v4.0",
                    "texts": ["hello", "goodbye"],
                    "input_type": "search_document",
                    "embedding_types": ["float", "int8"],
                }
            ]
        },
    )

    texts: list[StrictStr] | None = None
    inputs: list[EmbedInput] | None = Field(None, description="v2: text contents only")
    images: list[Any] | None = Field(None, description="Not served: text models only")
    model: StrictStr | None = None
    input_type: InputType | None = Field(
        None,
        description="Mapped to the model's prompt: search_query -> `query`, search_document -> "
        "`document` or `passage`, classification, clustering; no prompt if the model has none",
    )
    embedding_types: list[StrictStr] | None = Field(
        None, description="Any of float, int8, uint8, binary, ubinary, base64"
    )
    output_dimension: StrictInt | None = Field(None, description="Matryoshka truncation")
    truncate: Truncate = "END"
    max_tokens: StrictInt | None = Field(None, description="Cut each input after this many tokens")
