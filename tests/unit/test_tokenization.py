"""Prompts, truncation direction, limits and token-id inputs in the tokenizer pool."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from vectorpress.core.tokenization import INLINE_CHARS, TokenizerPool
from vectorpress.errors import EmptyError, TokenLimitError, ValidationError
from vectorpress.types import Truncation


@pytest.fixture(scope="module")
def pool(minilm: Path) -> TokenizerPool:
    return TokenizerPool.from_folder(
        minilm,
        max_input_length=8,
        position_offset=0,
        vocab_size=30522,
        prompts={"query": "query: "},
        default_prompt=None,
        workers=2,
    )


def encode(pool: TokenizerPool, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
    return asyncio.run(pool.encode(*args, **kwargs))  # type: ignore[arg-type]


def test_truncation_directions_keep_special_tokens(pool: TokenizerPool) -> None:
    text = "one two three four five six seven eight nine ten"
    right = encode(pool, [text], truncate=True)[0]
    left = encode(pool, [text], truncate=True, direction=Truncation.LEFT)[0]
    assert len(right) == len(left) == 8
    assert right.ids[0] == left.ids[0] == 101 and right.ids[-1] == left.ids[-1] == 102
    assert right.ids[1:-1] != left.ids[1:-1] and right.truncated
    with pytest.raises(TokenLimitError, match=r"less than 8 tokens\. Given: 12"):
        encode(pool, [text], truncate=False)


def test_prompts(pool: TokenizerPool) -> None:
    plain = encode(pool, ["hello"], truncate=True)[0]
    prompted = encode(pool, ["hello"], truncate=True, prompt_name="query")[0]
    assert len(prompted) == len(plain) + 2
    with pytest.raises(ValidationError, match=r'Available prompts: \["query"\]'):
        encode(pool, ["hello"], truncate=True, prompt_name="passage")


def test_empty_and_id_inputs(pool: TokenizerPool) -> None:
    with pytest.raises(EmptyError):
        encode(pool, [""], truncate=True)
    with pytest.raises(EmptyError):
        encode(pool, [[]], truncate=True)
    with pytest.raises(ValidationError, match="outside the vocabulary"):
        encode(pool, [[101, 40000]], truncate=True)
    ids = encode(pool, [[101, 7592, 102]], truncate=True)[0]
    assert ids.ids == [101, 7592, 102] and ids.chars == 3


def test_character_limit(pool: TokenizerPool) -> None:
    huge = "a" * (8 * 250 + 1)
    with pytest.raises(ValidationError, match="characters"):
        encode(pool, [huge], truncate=False)
    assert len(encode(pool, [huge], truncate=True)[0]) <= 8


def test_tokenize_reports_byte_offsets(pool: TokenizerPool) -> None:
    tokens = asyncio.run(pool.tokenize(["héllo world"], add_special_tokens=True, prompt_name=None))[
        0
    ]
    assert tokens[0].special and tokens[0].start is None
    words = [t for t in tokens if not t.special]
    assert words[-1].text == "world" and (words[-1].start, words[-1].stop) == (7, 12)


def test_small_requests_are_tokenized_inline_and_large_ones_on_the_pool(
    pool: TokenizerPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    on_loop: list[bool] = []
    real = pool._encode_singles

    def watched(*args: Any) -> Any:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return real(*args)

    monkeypatch.setattr(pool, "_encode_singles", watched)
    text = "seven " * (INLINE_CHARS // 6)
    alone = encode(pool, [text], truncate=True)
    twice = encode(pool, [text, text], truncate=True)
    # asyncio.run drives the loop on this (the main) thread.
    assert on_loop == [True, False]
    assert alone[0] == twice[0] == twice[1]
