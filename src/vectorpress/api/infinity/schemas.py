"""Infinity's request bodies. Unknown fields are ignored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from vectorpress.api.native.schemas import Priority


class InfinityRerankRequest(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {"query": "Where is Paris?", "documents": ["Paris is in France.", "Bread."]}
            ]
        },
    )

    query: StrictStr
    documents: list[StrictStr]
    model: StrictStr | None = None
    return_documents: StrictBool = False
    raw_scores: StrictBool = False
    top_n: StrictInt | None = Field(None, description="How many results, best first; all if absent")
    priority: Priority | None = Field(
        None, description="Extension: the lane (interactive or bulk); overrides `x-priority`"
    )


class InfinityClassifyRequest(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={"examples": [{"input": ["I love this!"], "raw_scores": False}]},
    )

    input: list[StrictStr]
    raw_scores: StrictBool
    model: StrictStr | None = None
