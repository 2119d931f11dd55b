"""JSON bodies refused as TEI refuses them: too deeply nested, not UTF-8, a lone surrogate.

TEI reads bodies with serde_json (through axum's `Json`), which refuses the 128th nested array
or object ("recursion limit exceeded") and a string that is not UTF-8 ("invalid unicode code
point"), or an escaped UTF-16 surrogate without its pair, each with its line and column, as
a 400. Python's parsers allow deeper nesting (pydantic
200, orjson 1024, json about 1000) and fail on bad bytes with messages of their own, or none
(FastAPI's "There was an error parsing the body"). These checks give serde_json's answer.
"""

from __future__ import annotations

import re

from fastapi import HTTPException, Request

#: serde_json's recursion limit: the 128th array or object open at once is refused.
MAX_DEPTH = 128

PREFIX = "Failed to parse the request body as JSON: "

#: A JSON string (its escapes skipped whole), or one bracket outside strings.
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)


def problem(raw: bytes) -> str | None:
    """serde_json's message for the first of these it would meet in `raw`; None for none.

    For a body that failed to parse: `refused` and bytes that are not UTF-8.
    """
    return _first(raw, _too_deep(raw), _lone_surrogate(raw), _not_utf8(raw))


def refused(raw: bytes) -> str | None:
    """serde_json's message for a body Python's parsers take but serde_json refuses: nesting
    of MAX_DEPTH, an escaped surrogate without its pair. None for a body without either.

    Cheap for every body: each is scanned for only when a count or a search in C finds it may
    be there (MAX_DEPTH opening brackets, strings included; an escaped surrogate).
    """
    return _first(raw, _too_deep(raw), _lone_surrogate(raw))


async def refuse_bodies(request: Request) -> None:
    """A dependency of every route: a body Python parsed but serde_json would not is a 400."""
    if request.method == "POST":
        message = refused(await request.body())
        if message is not None:
            raise HTTPException(400, PREFIX + message)


def _first(raw: bytes, *found: tuple[int, str] | None) -> str | None:
    present = [f for f in found if f is not None]
    if not present:
        return None
    index, message = min(present)
    return f"{message} at {_position(raw, index)}"


def _too_deep(raw: bytes) -> tuple[int, str] | None:
    if raw.count(b"[") + raw.count(b"{") < MAX_DEPTH:
        return None
    depth = 0
    for match in _TOKENS.finditer(raw):
        char = raw[match.start()]
        if char in b"[{":
            depth += 1
            if depth == MAX_DEPTH:
                return match.start(), "recursion limit exceeded"
        elif char in b"]}":
            depth -= 1
    return None


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")
#: Every escape, in order, so that an escaped backslash is never read as the start of one.
_ESCAPES = re.compile(rb"\\(?:u([0-9a-fA-F]{4})|.)", re.DOTALL)


def _lone_surrogate(raw: bytes) -> tuple[int, str] | None:
    # serde_json wants a \uD800-\uDBFF escape followed by a \uDC00-\uDFFF one, and words and
    # places each way of missing it as below.
    if _SURROGATE.search(raw) is None:
        return None
    paired_at = -1
    for match in _ESCAPES.finditer(raw):
        if match.start() == paired_at or match.group(1) is None:
            continue
        unit = int(match.group(1), 16)
        if 0xDC00 <= unit <= 0xDFFF:
            return match.end() - 1, "lone leading surrogate in hex escape"
        if not 0xD800 <= unit <= 0xDBFF:
            continue
        end = match.end()
        if raw[end : end + 1] != b"\\":
            return end, "unexpected end of hex escape"
        if raw[end + 1 : end + 2] != b"u":
            return end + 1, "unexpected end of hex escape"
        try:
            second = int(raw[end + 2 : end + 6], 16)
        except ValueError:
            return None  # a bad escape: the parser words that one
        if not 0xDC00 <= second <= 0xDFFF:
            return end + 5, "lone leading surrogate in hex escape"
        paired_at = end
    return None


def _not_utf8(raw: bytes) -> tuple[int, str] | None:
    # serde_json checks a string's bytes at its closing quote, and reports that position.
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = exc.start
    else:
        return None
    for match in _TOKENS.finditer(raw):
        if match.end() <= bad:
            continue
        if match.start() < bad and raw[match.start()] == ord('"'):
            return match.end() - 1, "invalid unicode code point"
        break
    return None  # outside any string: a syntax error the parser words itself


def _position(raw: bytes, index: int) -> str:
    """serde_json's position of the byte at `index`: 1-based line, 1-based byte column."""
    start_of_line = raw.rfind(b"\n", 0, index) + 1
    line = raw.count(b"\n", 0, index) + 1
    return f"line {line} column {index - start_of_line + 1}"
