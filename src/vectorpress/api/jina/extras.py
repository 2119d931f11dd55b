"""Jina's extras on /v1/embeddings: `task` as a prompt."""

from __future__ import annotations

from vectorpress.core.infer import Infer
from vectorpress.errors import ValidationError

#: Jina's tasks and the prompt names each may go by in a model's prompts, first match wins.
TASK_PROMPTS: dict[str, tuple[str, ...]] = {
    "retrieval.query": ("retrieval.query", "query"),
    "retrieval.passage": ("retrieval.passage", "passage", "document"),
    "text-matching": ("text-matching",),
    "classification": ("classification",),
    "separation": ("separation", "clustering"),
}


def task_prompt(infer: Infer, task: str | None) -> str | None:
    """The prompt name for Jina's `task`: one of the model's prompts, or None (no prompt)."""
    if task is None:
        return None
    if task in infer.spec.prompts:
        return task
    names = TASK_PROMPTS.get(task)
    if names is None:
        raise ValidationError(
            f"Input validation error: unknown task `{task}`; expected one of "
            + ", ".join(TASK_PROMPTS)
        )
    return next((name for name in names if name in infer.spec.prompts), None)
