"""OpenAI batch-API files: `/v1/embeddings` requests in, the batch output file out.

Each input line is `{"custom_id", "method": "POST", "url": "/v1/embeddings", "body": {...}}`;
each output line is `{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error"}` with the body the server's /v1/embeddings would answer (the same code builds it), or
a 4xx response whose body holds OpenAI's error object. A bad line fails alone.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError as PydanticValidationError

from vectorpress.errors import JobError, VectorpressError

if TYPE_CHECKING:
    from vectorpress.engine import Engine

URLS = ("/v1/embeddings", "/embeddings")
#: Requests run together: their inputs share the queue's batches. At most this many times
#: max_client_batch_size inputs wait at once, within the job's admission permits.
GROUP = 16


def _error_line(custom_id: Any, status: int, message: str, kind: str) -> dict[str, Any]:
    return {
        "id": f"vp-{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {
            "status_code": status,
            "request_id": uuid.uuid4().hex,
            "body": {"error": {"message": message, "type": kind, "param": None, "code": status}},
        },
        "error": None,
    }


def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                yield number, line


async def _answer(engine: Engine, number: int, line: bytes) -> dict[str, Any]:
    from vectorpress.api.openai.routes import run_embeddings
    from vectorpress.api.openai.schemas import EmbeddingsRequest

    try:
        request = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        return _error_line(None, 400, f"line {number} is not JSON: {exc}", "invalid_request_error")
    if not isinstance(request, dict):
        return _error_line(None, 400, f"line {number} is not an object", "invalid_request_error")
    custom_id = request.get("custom_id")
    if request.get("url") not in URLS or request.get("method", "POST") != "POST":
        return _error_line(
            custom_id,
            400,
            f"only POST {URLS[0]} is supported here, got {request.get('url')!r}",
            "invalid_request_error",
        )
    try:
        body = EmbeddingsRequest.model_validate(request.get("body"))
    except PydanticValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return _error_line(custom_id, 422, f"body.{where}: {first['msg']}", "Validation")
    try:
        payload, _ = await run_embeddings(engine.model_state, body)
    except VectorpressError as exc:
        return _error_line(custom_id, exc.http_status, exc.message, exc.error_type)
    return {
        "id": f"vp-{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": uuid.uuid4().hex, "body": payload},
        "error": None,
    }


async def _group(engine: Engine, lines: list[tuple[int, bytes]]) -> list[dict[str, Any]]:
    return list(await asyncio.gather(*(_answer(engine, n, line) for n, line in lines)))


def run_openai_batch(source: str, target: str, engine: Engine) -> str:
    """Answer every request of `source` into `target` (JSONL, in input order); one line summary."""
    src, dest = Path(source), Path(target)
    if not src.is_file():
        raise JobError(f"no batch file at {source!r}")
    if dest.is_dir():
        dest = dest / f"{src.stem}.output.jsonl"
    dest.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    ok = failed = tokens = 0
    tmp = dest.with_name(f".{dest.name}.tmp")
    with tmp.open("wb") as out:
        group: list[tuple[int, bytes]] = []

        def flush() -> None:
            nonlocal ok, failed, tokens
            for answer in engine.run_coroutine(_group(engine, group)):
                out.write(orjson.dumps(answer, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
                response = answer["response"]
                if response["status_code"] == 200:
                    ok += 1
                    tokens += response["body"]["usage"]["total_tokens"]
                else:
                    failed += 1
            group.clear()

        for item in _lines(src):
            group.append(item)
            if len(group) >= GROUP:
                flush()
        if group:
            flush()
    tmp.replace(dest)
    seconds = time.perf_counter() - started
    return (
        f"done: {ok} requests answered, {failed} failed, {tokens:,} tokens in {seconds:.1f} s; "
        f"output {dest}"
    )
