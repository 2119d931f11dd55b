"""OpenAI's embeddings request, with the extensions other providers' clients send to the same
route. Unknown fields are ignored; a body with none of the extensions is answered as before.
Jina's `truncate` stays ignored as TEI ignores it: --auto-truncate decides."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, StrictBool, StrictInt, StrictStr

from vectorpress.api.encodings import Dtype
from vectorpress.api.native.schemas import Input, Prioritized

EncodingFormat = Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]
JinaEmbeddingType = Literal["float", "base64", "int8", "uint8", "binary", "ubinary"]


class EmbeddingsRequest(Prioritized):
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={"examples": [{"input": "What is Deep Learning?", "model": "my-model"}]},
    )

    input: Input
    model: StrictStr | None = None
    user: StrictStr | None = None
    encoding_format: EncodingFormat = Field(
        "float",
        description="float or base64 (OpenAI); extension: int8, uint8, binary, ubinary as JSON "
        "integers",
    )
    dimensions: StrictInt | None = None
    embed_dtype: Dtype | None = Field(
        None,
        description="Extension (vLLM's): the type of each value, float32 (default), float16, "
        "bfloat16, int8, uint8, binary or ubinary; with `encoding_format: base64`, base64 of its "
        "little-endian bytes",
    )
    truncate_prompt_tokens: StrictInt | None = Field(
        None,
        description="Extension (vLLM's): keep the first N tokens of each input, special tokens "
        "included; -1 truncates to the model's maximum",
    )
    task: StrictStr | None = Field(
        None,
        description="Extension (Jina's): retrieval.query, retrieval.passage, text-matching, "
        "classification or separation, mapped to the model's prompt of that name (or query / "
        "passage); no prompt if it has none",
    )
    normalized: StrictBool | None = Field(
        None, description="Extension (Jina's): false answers vectors as pooled, unnormalized"
    )
    windowed: StrictBool | None = Field(
        None,
        description="Extension (vectorpress's, as /embed's): embed an input longer than the "
        "model's window as overlapping windows pooled by token-weighted mean, then normalized "
        "(vLLM's chunked processing), instead of truncating or refusing it; usage counts every "
        "window's tokens. Absent: the server's --windowed-inputs",
    )
    window_overlap: StrictInt | None = Field(
        None,
        description="Extension: tokens consecutive windows share (absent: --window-overlap)",
    )
    embedding_type: JinaEmbeddingType | None = Field(
        None,
        description="Extension (Jina's): float, base64 (of float32), binary or ubinary (packed "
        "sign bits as integers), int8 or uint8; takes precedence over `encoding_format`",
    )
