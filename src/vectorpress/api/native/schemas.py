"""Request bodies of TEI's routes. Unknown fields are ignored, as TEI does."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

from vectorpress.types import Truncation

TokenId = Annotated[StrictInt, Field(ge=0, le=2**32 - 1)]
#: One input: a text, or the token ids of one text.
InputItem = StrictStr | list[TokenId]
#: A single input (tried first, so a flat id list is one input) or a batch of them.
Input = StrictStr | list[TokenId] | list[InputItem]
Direction = Literal["Left", "left", "Right", "right"]


def to_truncation(direction: str) -> Truncation:
    return Truncation.LEFT if direction.lower() == "left" else Truncation.RIGHT


def as_batch(inputs: Input) -> tuple[list[str | list[int]], bool]:
    """The inputs as a list, and whether the request gave a batch."""
    if isinstance(inputs, str):
        return [inputs], False
    if not inputs or all(isinstance(i, int) for i in inputs):
        return [list(inputs)], False  # type: ignore[arg-type]
    return list(inputs), True  # type: ignore[arg-type]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class EmbedRequest(_Body):
    inputs: Input
    truncate: StrictBool | None = None
    truncation_direction: Direction = "Right"
    prompt_name: StrictStr | None = None
    normalize: StrictBool = True
    dimensions: StrictInt | None = None
