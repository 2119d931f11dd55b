"""Qwen3-Reranker's model-card recipe, written out, on transformers' AutoModelForCausalLM.

Each pair runs alone, so no padding enters; the prompt is the card's: prefix and suffix
tokenized without special tokens around the formatted pair, truncated in the middle only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import torch

from vectorpress.model_spec import (
    QWEN3_RERANKER_INSTRUCTION,
    QWEN3_RERANKER_PREFIX,
    QWEN3_RERANKER_SUFFIX,
)


def format_instruction(instruction: str, query: str, doc: str) -> str:
    return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {doc}"


def _format(template: str | None, instruction: str, query: str, doc: str) -> str:
    if template is None:
        return format_instruction(instruction, query, doc)
    values = {"query": query, "document": doc}
    return re.sub(r"\{(query|document)\}", lambda m: values[m.group(1)], template)


@torch.inference_mode()
def llm_rerank_scores(
    folder: Path,
    pairs: Sequence[tuple[str, str]],
    *,
    instruction: str = QWEN3_RERANKER_INSTRUCTION,
    prefix: str = QWEN3_RERANKER_PREFIX,
    suffix: str = QWEN3_RERANKER_SUFFIX,
    tokens: tuple[str, ...] = ("yes", "no"),
    max_length: int = 8192,
    template: str | None = None,
) -> list[float]:
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    prefix_tokens = tokenizer.encode(prefix, add_special_tokens=False)
    suffix_tokens = tokenizer.encode(suffix, add_special_tokens=False)
    token_true_id = tokenizer.convert_tokens_to_ids(tokens[0])
    token_false_id = tokenizer.convert_tokens_to_ids(tokens[1]) if len(tokens) == 2 else None
    scores = []
    for query, doc in pairs:
        body = tokenizer(
            [_format(template, instruction, query, doc)],
            padding=False,
            truncation="longest_first",
            return_attention_mask=False,
            max_length=max_length - len(prefix_tokens) - len(suffix_tokens),
        )["input_ids"][0]
        ids = torch.tensor([prefix_tokens + body + suffix_tokens])
        logits = model(input_ids=ids).logits[:, -1, :]
        if token_false_id is None:
            scores.append(float(torch.sigmoid(logits[0, token_true_id])))
            continue
        both = torch.stack([logits[:, token_false_id], logits[:, token_true_id]], dim=1)
        scores.append(float(torch.nn.functional.log_softmax(both, dim=1)[:, 1].exp()[0]))
    return scores
