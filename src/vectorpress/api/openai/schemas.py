"""OpenAI's embeddings request. Unknown fields are ignored."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, StrictInt, StrictStr

from vectorpress.api.native.schemas import Input, Prioritized


class EmbeddingsRequest(Prioritized):
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={"examples": [{"input": "What is Deep Learning?", "model": "my-model"}]},
    )

    input: Input
    model: StrictStr | None = None
    user: StrictStr | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
