"""Prompts, truncation direction, limits and token-id inputs in the tokenizer pool."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from vectorpress.core.tokenization import INLINE_CHARS, TokenizerPool
from vectorpress.errors import EmptyError, TokenLimitError, ValidationError
from vectorpress.types import Truncation


def make_pool(minilm: Path, length: int = 8, workers: int = 2) -> TokenizerPool:
    return TokenizerPool.from_folder(
        minilm,
        max_input_length=length,
        position_offset=0,
        vocab_size=30522,
        prompts={"query": "query: "},
        default_prompt=None,
        workers=workers,
    )


@pytest.fixture(scope="module")
def pool(minilm: Path) -> TokenizerPool:
    return make_pool(minilm)


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
    assert tokens.special[0] and tokens.starts[0] is None and tokens.texts[0] == "[CLS]"
    assert tokens.texts[-2] == "world" and (tokens.starts[-2], tokens.stops[-2]) == (7, 12)


@pytest.mark.parametrize(
    "text",
    [
        "plain ascii words",
        "héllo wörld ça va",
        "東京タワー と 大阪城",
        "emoji 🙂🚀 and 𝔘𝔫𝔦",
        "past the inline size: héllo 東京 🙂 [SEP] " * 12,
    ],
)
def test_tokenize_matches_the_tokenizer_and_utf8_offsets(
    pool: TokenizerPool, minilm: Path, text: str
) -> None:
    """Every token against the tokenizer's own encoding, offsets counted in UTF-8 bytes."""
    tokenizer = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    prompted = "query: " + text
    enc = tokenizer.encode(prompted)
    [got] = asyncio.run(pool.tokenize([text], add_special_tokens=True, prompt_name="query"))
    assert got.ids == enc.ids
    assert got.special == [bool(m) for m in enc.special_tokens_mask]
    for i, (start, stop) in enumerate(enc.offsets):
        if enc.special_tokens_mask[i]:
            assert (got.texts[i], got.starts[i], got.stops[i]) == (enc.tokens[i], None, None)
            continue
        assert got.texts[i] == prompted[start:stop]
        assert got.starts[i] == len(prompted[:start].encode("utf-8"))
        assert got.stops[i] == len(prompted[:stop].encode("utf-8"))


def test_long_inputs_encode_as_the_tokenizer_does(pool: TokenizerPool, minilm: Path) -> None:
    """Long inputs take the tokenizer's batch calls (which release the GIL): same answers."""
    tokenizer = Tokenizer.from_file(str(minilm / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(8)
    text = "héllo 東京 🙂 and words " * 30
    assert len(text) > INLINE_CHARS
    [single] = encode(pool, [text], truncate=True)
    assert single.ids == tokenizer.encode(text).ids and single.truncated
    [pair] = asyncio.run(pool.encode_pairs([(text, text[::-1])], truncate=True))
    reference = tokenizer.encode(text, text[::-1])
    assert (pair.ids, pair.type_ids) == (reference.ids, reference.type_ids)
    tokenizer.no_truncation()
    ids = tokenizer.encode(text * 2).ids
    assert len(ids) > INLINE_CHARS
    [decoded] = asyncio.run(pool.decode([ids], skip_special_tokens=True))
    assert decoded == tokenizer.decode(ids)


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


def test_a_pooled_request_is_encoded_in_one_call_as_each_text_alone(minilm: Path) -> None:
    """Texts, short and long, between token-id inputs, in a request large enough for the pool
    (one batch call for its texts): each as the tokenizer encodes it alone, in order."""
    pool = make_pool(minilm, length=32)
    try:
        texts = ["short one", "word " * 60, "a bit longer text, with punctuation!", "x" * 300]
        inputs: list[Any] = [texts[0], [101, 2023, 102], texts[1], texts[2], [101, 102], texts[3]]
        assert sum(len(t) for t in texts) > INLINE_CHARS
        got = encode(pool, inputs, truncate=True)
        alone = Tokenizer.from_file(str(minilm / "tokenizer.json"))
        alone.no_padding()
        alone.enable_truncation(32)
        want_texts = iter(alone.encode(t) for t in texts)
        for item, enc in zip(inputs, got, strict=True):
            if isinstance(item, list):
                assert enc.ids == item
                continue
            want = next(want_texts)
            assert enc.ids == want.ids
            assert enc.truncated == bool(want.overflowing)
    finally:
        pool.close()


def test_the_tokenizers_own_thread_pool_is_off_unless_the_user_says(
    minilm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def make() -> None:
        make_pool(minilm, workers=1).close()

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    make()
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    make()
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"


def test_a_pooled_pair_request_is_encoded_in_one_call_as_each_pair_alone(minilm: Path) -> None:
    """(query, passage) pairs and single texts in one request large enough for the pool: each
    as the tokenizer encodes it alone, truncated alike, token types included, in order."""
    pool = make_pool(minilm, length=24)
    try:
        long = "passage words " * 30
        inputs: list[Any] = [("what is it", long), "a single text", ("q", "short passage"), long]
        got = asyncio.run(pool.encode_pairs(inputs, truncate=True))
        alone = Tokenizer.from_file(str(minilm / "tokenizer.json"))
        alone.no_padding()
        alone.enable_truncation(24)
        for item, enc in zip(inputs, got, strict=True):
            want = alone.encode(item) if isinstance(item, str) else alone.encode(*item)
            assert (enc.ids, enc.type_ids) == (want.ids, want.type_ids)
            assert enc.truncated == bool(want.overflowing)
        assert any(t == 1 for t in got[0].type_ids) and got[0].truncated
    finally:
        pool.close()


def test_wrapped_texts_in_one_call_match_each_text_alone(minilm: Path) -> None:
    """An LLM reranker's texts between a fixed prefix and suffix, in a request large enough for
    the pool: the prefix's and suffix's tokens around each text's own, truncated to the room
    left, as the tokenizer encodes each text alone."""
    pool = make_pool(minilm, length=24)
    try:
        texts = ["a short one", "document words " * 30, "x" * 200, "another document here"]
        got = asyncio.run(
            pool.encode_wrapped(texts, prefix="judge this", suffix="yes", truncate=True)
        )
        alone = Tokenizer.from_file(str(minilm / "tokenizer.json"))
        alone.no_padding()
        head = alone.encode("judge this", add_special_tokens=False).ids
        tail = alone.encode("yes", add_special_tokens=False).ids
        alone.enable_truncation(24 - len(head) - len(tail))
        for text, enc in zip(texts, got, strict=True):
            want = alone.encode(text)
            assert enc.ids == [*head, *want.ids, *tail]
            assert enc.truncated == bool(want.overflowing)
        assert got[1].truncated and len(got[1].ids) == 24
    finally:
        pool.close()


def test_windows_in_one_call_match_each_text_alone(minilm: Path) -> None:
    """Long texts (and pairs) cut into overlapping windows in one call: each text's windows as
    the tokenizer makes them for it alone."""
    pool = make_pool(minilm, length=16)
    try:
        texts = ["one two three " * 12, "short", "alpha beta gamma delta " * 9]
        alone = Tokenizer.from_file(str(minilm / "tokenizer.json"))
        alone.no_padding()
        alone.enable_truncation(16, stride=3)
        got = asyncio.run(pool.encode_windows(texts, overlap=3))
        for text, windows in zip(texts, got, strict=True):
            want = alone.encode(text)
            assert [w.ids for w in windows] == [want.ids, *(o.ids for o in want.overflowing)]
            assert [w.chars for w in windows] == [len(text)] + [0] * len(want.overflowing)
        assert len(got[0]) > 2
        alone.enable_truncation(16, stride=3, strategy="only_second")
        pairs = asyncio.run(pool.encode_pair_windows("the query", texts, overlap=3))
        for text, windows in zip(texts, pairs, strict=True):
            want = alone.encode("the query", text)
            assert [(w.ids, w.type_ids) for w in windows] == [
                (e.ids, e.type_ids) for e in [want, *want.overflowing]
            ]
    finally:
        pool.close()
