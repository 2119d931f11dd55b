"""vLLM's request bodies. Unknown fields are ignored."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from vectorpress.api.native.schemas import Priority, TokenId

Texts = StrictStr | list[StrictStr]


class ScoreRequest(BaseModel):
    """The pairs come as `text_1`/`text_2`, `queries`/`documents`, `queries`/`items` or
    `data_1`/`data_2`: a text or a list each; one left text is paired with every right one."""

    model_config = ConfigDict(
        extra="ignore",
        json_schema_extra={
            "examples": [
                {"text_1": "What is the capital of France?", "text_2": ["Paris.", "Rome."]}
            ]
        },
    )

    model: StrictStr | None = None
    text_1: Texts | None = None
    text_2: Texts | None = None
    queries: Texts | None = None
    documents: Texts | None = None
    items: Texts | None = None
    data_1: Texts | None = None
    data_2: Texts | None = None
    use_activation: StrictBool | None = Field(
        None, description="false answers a cross-encoder's raw scores instead of sigmoid"
    )
    truncate_prompt_tokens: StrictInt | None = Field(
        None, description="-1 truncates each pair to the model's maximum length"
    )
    priority: Priority | None = Field(
        None, description="Extension: the lane (interactive or bulk); overrides `x-priority`"
    )


class VllmClassifyRequest(BaseModel):
    model_config = ConfigDict(
        extra="ignore", json_schema_extra={"examples": [{"input": ["I love this!", "Meh."]}]}
    )

    input: Texts
    model: StrictStr | None = None
    use_activation: StrictBool | None = Field(
        None, description="false answers raw logits instead of softmax (sigmoid for one label)"
    )
    truncate_prompt_tokens: StrictInt | None = Field(
        None, description="-1 truncates each input to the model's maximum length"
    )


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(
        extra="ignore", json_schema_extra={"examples": [{"tokens": [101, 102]}]}
    )

    tokens: list[TokenId]
    model: StrictStr | None = None
