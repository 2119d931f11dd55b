"""Log output: plain lines, or one JSON object per line with `--json-output`, as TEI.

A JSON line carries `timestamp` (RFC 3339, UTC), `level`, `message`, `target` (the logger),
`filename`, `line_number`, and `fields` with whatever a call passed through `extra=`. While a
traced request runs, `span` and `spans` name the current span with its trace and span ids;
`--disable-spans` leaves them out. Lines go to stdout, as TEI's do, so that stderr keeps only
the one-line start-up errors.

Secrets (`--api-key`, `--hf-token`) are never passed to a logger; as a second guard, every
formatted line has any occurrence of them replaced before it is written.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from collections.abc import Iterable
from typing import Any, TextIO

import orjson

from vectorpress.observability.tracing import current_ids
from vectorpress.settings import Settings

REDACTED = "<redacted>"

# Secrets shorter than this are not searched for: replacing every "k" of every line would
# destroy the logs while protecting nothing.
_MIN_SECRET_LENGTH = 4

# Attributes every LogRecord has; anything else on a record came from `extra=`. uvicorn adds
# `color_message`, the same text with terminal colour codes.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "taskName",
    "color_message",
}


def _source(pathname: str) -> str:
    """The file relative to its package root (vectorpress/server.py), as TEI logs it."""
    for marker in ("/site-packages/", "/src/"):
        if marker in pathname:
            return pathname.rsplit(marker, 1)[1]
    return pathname


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class _Redacting(logging.Formatter):
    def __init__(self, secrets: Iterable[str | None]) -> None:
        super().__init__()
        self.secrets = sorted(
            {s for s in secrets if s and len(s) >= _MIN_SECRET_LENGTH}, key=len, reverse=True
        )

    def redact(self, line: str) -> str:
        for secret in self.secrets:
            line = line.replace(secret, REDACTED)
        return line


class JsonFormatter(_Redacting):
    """One JSON object per record."""

    def __init__(self, secrets: Iterable[str | None] = (), spans: bool = True) -> None:
        super().__init__(secrets)
        self.spans = spans

    def format(self, record: logging.LogRecord) -> str:
        stamp = dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
        line: dict[str, Any] = {
            "timestamp": stamp.isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "message": record.getMessage(),
            "target": record.name,
            "filename": _source(record.pathname),
            "line_number": record.lineno,
        }
        fields = _fields(record)
        if fields:
            line["fields"] = fields
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if self.spans:
            ids = current_ids()
            if ids is not None:
                trace_id, span_id, name = ids
                span = {"name": name, "trace_id": trace_id, "span_id": span_id}
                line["span"] = span
                line["spans"] = [span]
        text = orjson.dumps(line, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
        return self.redact(text)


class TextFormatter(_Redacting):
    """`time LEVEL target: message key=value ...`."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = dt.datetime.fromtimestamp(record.created, dt.timezone.utc)
        text = (
            f"{stamp.isoformat(timespec='milliseconds').replace('+00:00', 'Z')} "
            f"{record.levelname:>5} {record.name}: {record.getMessage()}"
        )
        fields = _fields(record)
        if fields:
            text += " " + " ".join(f"{k}={v}" for k, v in fields.items())
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return self.redact(text)


def configure(
    settings: Settings, stream: TextIO | None = None, level: str = "info"
) -> logging.Handler:
    """Install one handler on the root logger, at `level` (the CLI passes LOG_LEVEL)."""
    secrets = settings.secrets
    formatter: logging.Formatter = (
        JsonFormatter(secrets, spans=not settings.server.disable_spans)
        if settings.server.json_output
        else TextFormatter(secrets)
    )
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    # Start-up probes of the optional backends and the HTTP client are noise at info level.
    for noisy in ("httpx", "httpcore", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(max(root.level, logging.WARNING))
    return handler
