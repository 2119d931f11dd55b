"""Tokenization: prompts, truncation with direction, limits, position offsets; small requests on
the event loop, larger ones on a pool of threads (`INLINE_CHARS`).

Each thread that tokenizes owns its own copy of the fast tokenizer, because truncation is a
mutable setting of a `tokenizers.Tokenizer` and must not change under another thread's call.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar, cast

import numpy as np
from tokenizers import Encoding as TokenizerEncoding
from tokenizers import Tokenizer

from vectorpress.errors import (
    EmptyError,
    StartupError,
    TokenizerError,
    TokenLimitError,
    ValidationError,
)
from vectorpress.types import Encoding, Truncation

R = TypeVar("R")

#: One input as a caller gives it: text, or token ids.
TextInput = str | list[int]
#: A text or a pair of texts (query, passage) for cross-encoders.
PairInput = str | tuple[str, str]

#: Requests up to this many characters (or token ids) are tokenized on the event loop itself:
#: about 0.1 ms of work, against a round trip to a pool thread of 0.25 ms when idle (more
#: while the model's threads hold the cores), which a short query paid twice.
INLINE_CHARS = 256

#: TEI bounds the characters of an input by 250 per token of the model's limit, so that a
#: huge string cannot keep a tokenizer thread busy for seconds.
CHARS_PER_TOKEN = 250


@dataclass(frozen=True)
class Tokens:
    """The tokens of one input as /tokenize reports them, column by column.

    Offsets are byte offsets into the (prompted) input, None for special tokens. Columns, not
    an object per token: an input of 60,000 CJK characters is 60,000 tokens, and making one
    Python object each cost more than tokenizing it.
    """

    ids: list[int]
    texts: list[str]
    special: list[bool]
    starts: list[int | None]
    stops: list[int | None]

    def __len__(self) -> int:
        return len(self.ids)


class _Local(threading.local):
    tokenizer: Tokenizer | None = None
    truncation: tuple[int, str] | None = None


class TokenizerPool:
    """Encodes inputs for one model on a pool of threads, small requests on the event loop."""

    def __init__(
        self,
        tokenizer_json: str,
        *,
        max_input_length: int,
        position_offset: int,
        vocab_size: int,
        prompts: dict[str, str],
        default_prompt: str | None,
        workers: int,
    ) -> None:
        # This pool's threads are the parallelism: inside one batch call, the tokenizers
        # library's own thread pool only spun (on an H200's 16 cores under 32-text requests,
        # 16 of its threads took 0.35 of a core each, and the server ran 175-200k tokens/s
        # instead of 236-253k). The library reads the variable on every call; a value the
        # user set stands.
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self._json = tokenizer_json
        self.max_input_length = max_input_length
        self.position_offset = position_offset
        self.vocab_size = vocab_size
        self.prompts = prompts
        self.default_prompt = default_prompt
        self.max_chars = max_input_length * CHARS_PER_TOKEN
        self.workers = workers
        self._local = _Local()
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="vp-tokenize")
        # Fails at start-up, not on the first request; kept for this thread, usually the one
        # that runs the event loop and tokenizes short requests inline.
        self._local.tokenizer = self._new_tokenizer()

    @classmethod
    def from_folder(cls, folder: Path, **kwargs: object) -> TokenizerPool:
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise StartupError(f"{folder} has no tokenizer.json (only fast tokenizers are served)")
        return cls(path.read_text(encoding="utf-8"), **kwargs)  # type: ignore[arg-type]

    def _new_tokenizer(self) -> Tokenizer:
        tok = Tokenizer.from_str(self._json)
        tok.no_padding()
        tok.no_truncation()
        return tok

    def _tokenizer(self, truncation: tuple[int, str] | None) -> Tokenizer:
        local = self._local
        if local.tokenizer is None:
            local.tokenizer = self._new_tokenizer()
            local.truncation = None
        tok = local.tokenizer
        if local.truncation != truncation:
            if truncation is None:
                tok.no_truncation()
            else:
                tok.enable_truncation(truncation[0], direction=truncation[1])
            local.truncation = truncation
        return tok

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _call(self, size: int, fn: Callable[..., R], *args: object) -> R:
        """`fn(*args)` inline when the request is small (INLINE_CHARS), else on the pool."""
        if size <= INLINE_CHARS:
            return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    # -- prompts -------------------------------------------------------------------------------

    def resolve_prompt(self, prompt_name: str | None) -> str | None:
        """The prompt text a request gets: its named prompt, else the default one."""
        if prompt_name is None:
            return self.default_prompt
        if prompt_name not in self.prompts:
            # The list is written as TEI writes it; clients (tei-client) parse it from here.
            available = ", ".join(f'"{name}"' for name in sorted(self.prompts))
            raise ValidationError(
                f"Input validation error: prompt `{prompt_name}` was not found in the "
                f"Sentence Transformers prompts. Available prompts: [{available}]"
            )
        return self.prompts[prompt_name]

    # -- encoding ------------------------------------------------------------------------------

    async def encode(
        self,
        inputs: Sequence[TextInput],
        *,
        truncate: bool,
        direction: Truncation = Truncation.RIGHT,
        prompt_name: str | None = None,
        max_length: int | None = None,
    ) -> list[Encoding]:
        """Encode single inputs (texts or token ids); all or nothing. `max_length` lowers the
        model's limit for this call (a ColBERT query's length)."""
        prompt = self.resolve_prompt(prompt_name)
        items = list(inputs)
        size = _size(items, prompt)
        limit = self.max_input_length if max_length is None else max_length
        return await self._call(
            size, self._encode_singles, items, truncate, direction, prompt, limit
        )

    async def encode_pairs(
        self,
        inputs: Sequence[PairInput],
        *,
        truncate: bool,
        direction: Truncation = Truncation.RIGHT,
    ) -> list[Encoding]:
        """Encode texts and (query, passage) pairs for classifiers and rerankers.

        The default prompt applies to single texts only: prepending it to one side of a pair
        would change what a cross-encoder scores.
        """
        prompt = self.default_prompt
        items = list(inputs)
        size = sum(len(i) if isinstance(i, str) else len(i[0]) + len(i[1]) for i in items)
        size += len(prompt or "") * len(items)
        return await self._call(size, self._encode_pairs, items, truncate, direction, prompt)

    async def encode_windows(
        self, inputs: Sequence[str], *, overlap: int, prompt_name: str | None = None
    ) -> list[list[Encoding]]:
        """Each text whole, as windows of the model's length that share `overlap` tokens, each
        with its own special tokens (the tokenizer's overflowing encodings)."""
        if not 0 <= overlap < self.max_input_length // 2:
            raise ValidationError(
                f"Input validation error: `window_overlap` must be between 0 and "
                f"{self.max_input_length // 2 - 1}, got {overlap}"
            )
        prompt = self.resolve_prompt(prompt_name)
        items = list(inputs)
        size = _size(items, prompt)
        return await self._call(size, self._encode_windows, items, overlap, prompt)

    def _encode_windows(
        self, texts: list[str], overlap: int, prompt: str | None
    ) -> list[list[Encoding]]:
        # A tokenizer of its own: the stride is not part of the pooled tokenizers' state.
        tok = self._new_tokenizer()
        tok.enable_truncation(self.max_input_length, stride=overlap)
        if not all(texts):
            raise EmptyError("Input validation error: `inputs` cannot be empty")
        items: list[str | tuple[str, str]] = [(prompt or "") + text for text in texts]
        return self._windows(tok, items, [len(text) for text in texts])

    def _windows(
        self, tok: Tokenizer, items: list[str | tuple[str, str]], chars: list[int]
    ) -> list[list[Encoding]]:
        """Each item's windows (the tokenizer's overflowing encodings), in one call."""
        try:
            encs = _encode_all(tok, items, full=True)
        except Exception as exc:
            raise TokenizerError(f"tokenizer error: {exc}") from exc
        return [
            [
                Encoding(w.ids, w.type_ids, self.position_offset, n if i == 0 else 0)
                for i, w in enumerate([enc, *enc.overflowing])
            ]
            for enc, n in zip(encs, chars, strict=True)
        ]

    async def encode_pair_windows(
        self, query: str, texts: Sequence[str], *, overlap: int
    ) -> list[list[Encoding]]:
        """(query, text) pairs whole, each text cut into windows that share `overlap` tokens,
        every window with the whole query (the tokenizer's overflowing encodings)."""
        if not 0 <= overlap < self.max_input_length // 2:
            raise ValidationError(
                f"Input validation error: `window_overlap` must be between 0 and "
                f"{self.max_input_length // 2 - 1}, got {overlap}"
            )
        items = list(texts)
        size = sum(len(t) for t in items) + len(query) * len(items)
        return await self._call(size, self._encode_pair_windows, query, items, overlap)

    def _encode_pair_windows(
        self, query: str, texts: list[str], overlap: int
    ) -> list[list[Encoding]]:
        tok = self._new_tokenizer()
        tok.enable_truncation(self.max_input_length, stride=overlap, strategy="only_second")
        if not query and not all(texts):
            raise EmptyError("Input validation error: `inputs` cannot be empty")
        items: list[str | tuple[str, str]] = [(query, text) for text in texts]
        return self._windows(tok, items, [len(query) + len(text) for text in texts])

    async def encode_wrapped(
        self, texts: Sequence[str], *, prefix: str, suffix: str, truncate: bool
    ) -> list[Encoding]:
        """Encode texts between a fixed prefix and suffix (an LLM reranker's prompt): those are
        tokenized apart without special tokens, and truncation cuts the text only."""
        items = list(texts)
        size = sum(len(t) for t in items) + (len(prefix) + len(suffix)) * len(items)
        return await self._call(size, self._encode_wrapped, items, prefix, suffix, truncate)

    def _encode_wrapped(
        self, texts: list[str], prefix: str, suffix: str, truncate: bool
    ) -> list[Encoding]:
        plain = self._tokenizer(None)
        head = plain.encode(prefix, add_special_tokens=False).ids if prefix else []
        tail = plain.encode(suffix, add_special_tokens=False).ids if suffix else []
        room = self.max_input_length - len(head) - len(tail)
        if room <= 0:
            raise ValidationError(
                f"Input validation error: the prompt alone takes {len(head) + len(tail)} of the "
                f"model's {self.max_input_length} tokens"
            )
        chars = [len(t) for t in texts]
        items: list[str | tuple[str, str]] = [
            self._check_chars(t, truncate, self.max_chars) for t in texts
        ]
        tok = self._tokenizer((room, Truncation.RIGHT.value) if truncate else None)
        try:
            encs = _encode_all(tok, items)
        except Exception as exc:
            raise TokenizerError(f"tokenizer error: {exc}") from exc
        out = []
        for enc, n, item in zip(encs, chars, items, strict=True):
            ids = [*head, *enc.ids, *tail]
            truncated = bool(enc.overflowing) or n != _chars(item)
            out.append(self._finish(ids, [0] * len(ids), n, truncate, truncated))
        return out

    def _check_chars(self, text: str, truncate: bool, limit: int) -> str:
        if len(text) <= limit:
            return text
        if truncate:
            return text[:limit]
        raise ValidationError(
            f"Input validation error: `inputs` must have less than {self.max_chars} "
            f"characters. Given: {len(text)}"
        )

    def _finish(
        self,
        ids: list[int],
        type_ids: list[int],
        chars: int,
        truncate: bool,
        truncated: bool,
        limit: int | None = None,
    ) -> Encoding:
        limit = self.max_input_length if limit is None else limit
        if len(ids) > limit:
            raise TokenLimitError(
                f"Input validation error: `inputs` must have less than {limit} tokens. "
                f"Given: {len(ids)}"
            )
        return Encoding(
            ids=ids,
            type_ids=type_ids,
            position_offset=self.position_offset,
            chars=chars,
            truncated=truncated,
        )

    def _encode_ids(
        self,
        ids: list[int],
        truncate: bool,
        direction: Truncation,
        prompt: str | None,
        limit: int | None = None,
    ) -> Encoding:
        limit = self.max_input_length if limit is None else limit
        if not ids:
            raise EmptyError("Input validation error: `inputs` cannot be empty")
        bad = next((i for i in ids if not 0 <= i < self.vocab_size), None)
        if bad is not None:
            raise ValidationError(
                f"Input validation error: token id {bad} is outside the vocabulary "
                f"(size {self.vocab_size})"
            )
        if prompt:
            # As TEI: with a prompt, ids are decoded, prompted, and encoded again.
            tok = self._tokenizer(None)
            text = prompt + _decode(tok, ids, skip_special_tokens=True)
            enc = self._encode_text(text, truncate, direction, limit)
            return Encoding(enc.ids, enc.type_ids, enc.position_offset, len(ids), enc.truncated)
        truncated = False
        if len(ids) > limit and truncate:
            ids = ids[:limit] if direction is Truncation.RIGHT else ids[-limit:]
            truncated = True
        return self._finish(list(ids), [0] * len(ids), len(ids), truncate, truncated, limit)

    def _encode_text(
        self, text: str, truncate: bool, direction: Truncation, limit: int | None = None
    ) -> Encoding:
        return self._encode_texts([text], truncate, direction, limit)[0]

    def _encode_texts(
        self, texts: list[str], truncate: bool, direction: Truncation, limit: int | None = None
    ) -> list[Encoding]:
        """Texts in one tokenizer call (`_encode_all`)."""
        chars = [len(t) for t in texts]
        items: list[str | tuple[str, str]] = [
            self._check_chars(t, truncate, self.max_chars) for t in texts
        ]
        return self._encode_items(items, chars, truncate, direction, limit)

    def _encode_items(
        self,
        items: list[str | tuple[str, str]],
        chars: list[int],
        truncate: bool,
        direction: Truncation,
        limit: int | None = None,
    ) -> list[Encoding]:
        """Texts and pairs, their characters already checked (`chars`: each one's count
        before), in one tokenizer call (`_encode_all`)."""
        limit = self.max_input_length if limit is None else limit
        tok = self._tokenizer((limit, direction.value) if truncate else None)
        try:
            encs = _encode_all(tok, items)
        except Exception as exc:
            raise TokenizerError(f"tokenizer error: {exc}") from exc
        return [
            self._finish(
                enc.ids,
                enc.type_ids,
                n,
                truncate,
                bool(enc.overflowing) or n != _chars(item),
                limit,
            )
            for enc, n, item in zip(encs, chars, items, strict=True)
        ]

    def _encode_singles(
        self,
        inputs: list[TextInput],
        truncate: bool,
        direction: Truncation,
        prompt: str | None,
        limit: int | None = None,
    ) -> list[Encoding]:
        out: list[Encoding | None] = [None] * len(inputs)
        texts: list[str] = []
        places: list[int] = []
        for i, item in enumerate(inputs):
            if isinstance(item, str):
                if not item:
                    raise EmptyError("Input validation error: `inputs` cannot be empty")
                texts.append((prompt or "") + item)
                places.append(i)
            else:
                out[i] = self._encode_ids(item, truncate, direction, prompt, limit)
        if texts:
            encoded = self._encode_texts(texts, truncate, direction, limit)
            for i, enc in zip(places, encoded, strict=True):
                out[i] = enc
        return cast(list[Encoding], out)

    def _encode_pairs(
        self, inputs: list[PairInput], truncate: bool, direction: Truncation, prompt: str | None
    ) -> list[Encoding]:
        items: list[str | tuple[str, str]] = []
        chars: list[int] = []
        half = self.max_chars // 2
        for item in inputs:
            if isinstance(item, str):
                if not item:
                    raise EmptyError("Input validation error: `inputs` cannot be empty")
                text = (prompt or "") + item
                chars.append(len(text))
                items.append(self._check_chars(text, truncate, self.max_chars))
                continue
            first, second = item
            if not first and not second:
                raise EmptyError("Input validation error: `inputs` cannot be empty")
            chars.append(len(first) + len(second))
            items.append(
                (
                    self._check_chars(first, truncate, half),
                    self._check_chars(second, truncate, half),
                )
            )
        return self._encode_items(items, chars, truncate, direction)

    # -- /tokenize and /decode -----------------------------------------------------------------

    async def tokenize(
        self, inputs: Sequence[str], *, add_special_tokens: bool, prompt_name: str | None
    ) -> list[Tokens]:
        prompt = self.resolve_prompt(prompt_name)
        items = list(inputs)
        return await self._call(
            _size(items, prompt), self._tokenize, items, add_special_tokens, prompt
        )

    def _tokenize(
        self, inputs: list[str], add_special_tokens: bool, prompt: str | None
    ) -> list[Tokens]:
        tok = self._tokenizer(None)
        if not all(inputs):
            raise EmptyError("Input validation error: `inputs` cannot be empty")
        texts = [(prompt or "") + text for text in inputs]
        for text in texts:
            self._check_chars(text, False, self.max_chars)
        try:
            encs = _encode_all(tok, list(texts), add_special_tokens=add_special_tokens, full=True)
        except Exception as exc:
            raise TokenizerError(f"tokenizer error: {exc}") from exc
        return [
            _tokens(tok, text, enc.ids, enc.offsets, enc.special_tokens_mask)
            for text, enc in zip(texts, encs, strict=True)
        ]

    async def decode(self, ids: Sequence[Sequence[int]], *, skip_special_tokens: bool) -> list[str]:
        seqs = [list(i) for i in ids]
        return await self._call(sum(map(len, seqs)), self._decode, seqs, skip_special_tokens)

    def _decode(self, ids: list[list[int]], skip_special_tokens: bool) -> list[str]:
        tok = self._tokenizer(None)
        out = []
        vocab = tok.get_vocab_size(with_added_tokens=True)
        for seq in ids:
            if not seq:
                raise EmptyError("Input validation error: `input_ids` cannot be empty")
            # min and max run in C; the generator only runs to name a bad id.
            if min(seq) < 0 or max(seq) >= vocab:
                bad = next(i for i in seq if not 0 <= i < vocab)
                raise ValidationError(
                    f"Input validation error: token id {bad} is outside the vocabulary "
                    f"(size {vocab})"
                )
            try:
                out.append(_decode(tok, seq, skip_special_tokens=skip_special_tokens))
            except Exception as exc:
                raise TokenizerError(f"tokenizer error: {exc}") from exc
        return out


def _size(items: Sequence[str | list[int]], prompt: str | None) -> int:
    """Characters (or token ids) a request asks to tokenize, its prompt on each input."""
    return sum(len(i) for i in items) + len(prompt or "") * len(items)


def _chars(item: str | tuple[str, str]) -> int:
    return len(item) if isinstance(item, str) else len(item[0]) + len(item[1])


def _encode_all(
    tok: Tokenizer,
    items: list[str | tuple[str, str]],
    *,
    add_special_tokens: bool = True,
    full: bool = False,
) -> list[TokenizerEncoding]:
    """Texts and (query, passage) pairs: one by one where they are short together (on the event
    loop: no round trip to a pool thread, `INLINE_CHARS`), else in one batch call, which lets go
    of the interpreter lock for all its work (`Tokenizer.encode` holds it for its whole run: a
    quarter of a second for 60,000 CJK characters, which stops the event loop even from a pool
    thread).

    One call per text held the lock for each short one, and the GPU's device thread waits for
    that lock between its calls: on an H200 under 32-text requests x 16 in flight, the server
    ran 236-253k tokens/s with one call per request against 205-213k with one per text.

    `full`: offsets or overflowing windows are wanted. The batch call without offsets (all
    that embedding needs) is faster, but it has none, and it gives a pair's overflowing windows
    the first text's token type throughout (tokenizers 0.23.3; `encode` and `encode_batch` give
    the second text's).
    """
    if sum(_chars(i) for i in items) <= INLINE_CHARS:
        return [
            tok.encode(i, add_special_tokens=add_special_tokens)
            if isinstance(i, str)
            else tok.encode(i[0], i[1], add_special_tokens=add_special_tokens)
            for i in items
        ]
    batch = tok.encode_batch if full else tok.encode_batch_fast
    return batch(items, add_special_tokens=add_special_tokens)


def _decode(tok: Tokenizer, ids: list[int], *, skip_special_tokens: bool) -> str:
    """`tok.decode`; a long sequence through the batch call, which lets go of the lock."""
    if len(ids) <= INLINE_CHARS:
        return tok.decode(ids, skip_special_tokens=skip_special_tokens)
    return tok.decode_batch([ids], skip_special_tokens=skip_special_tokens)[0]


def _tokens(
    tok: Tokenizer,
    text: str,
    ids: list[int],
    offsets: list[tuple[int, int]],
    special: list[int],
) -> Tokens:
    """One input's tokens in time linear in its length: byte offsets from one table of the
    text's characters, each token's text sliced from the text (its characters are whole)."""
    texts = [text[a:b] for a, b in offsets]
    starts: list[int | None]
    stops: list[int | None]
    if text.isascii():
        starts, stops = [a for a, _ in offsets], [b for _, b in offsets]
    else:
        table = _byte_offsets(text)
        starts, stops = [table[a] for a, _ in offsets], [table[b] for _, b in offsets]
    flags = [bool(s) for s in special]
    for i in [i for i, flag in enumerate(flags) if flag]:
        # Special tokens have no place in the text: their own piece, and no offsets (TEI).
        texts[i] = tok.id_to_token(ids[i]) or ""
        starts[i] = stops[i] = None
    return Tokens(ids, texts, flags, starts, stops)


def _byte_offsets(text: str) -> list[int]:
    """table[i] = the UTF-8 byte offset of character i; table[len(text)] = the text's bytes."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    widths = 1 + (points >= 0x80).astype(np.int64) + (points >= 0x800) + (points >= 0x10000)
    table = np.zeros(len(points) + 1, dtype=np.int64)
    np.cumsum(widths, out=table[1:])
    return table.tolist()
