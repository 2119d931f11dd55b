"""Log line formats: JSON fields and spans, --disable-spans, redaction in both formats."""

from __future__ import annotations

import io
import json
import logging

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from vectorpress.observability.logging import REDACTED, configure
from vectorpress.settings import Settings

KEY = "sk-format-test-key"


def emit(settings: Settings, traced: bool) -> str:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    configure(settings, stream)
    try:
        log = logging.getLogger("vectorpress.test")
        if traced:
            tracer = TracerProvider().get_tracer("test")
            with tracer.start_as_current_span("POST /embed"):
                log.warning("request with %s", KEY, extra={"inputs": 3})
        else:
            log.warning("request with %s", KEY, extra={"inputs": 3})
        try:
            raise ValueError(f"bad {KEY}")
        except ValueError:
            log.exception("failed")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    return stream.getvalue()


def test_json_line_has_fields_and_the_current_span() -> None:
    text = emit(Settings.single("m", json_output=True, api_key=KEY), traced=True)
    lines = [json.loads(line) for line in text.splitlines()]
    assert len(lines) == 2, text
    first = lines[0]
    assert first["level"] == "WARNING" and first["target"] == "vectorpress.test"
    assert first["message"] == f"request with {REDACTED}"
    assert first["fields"] == {"inputs": 3}
    assert first["span"]["name"] == "POST /embed" and len(first["span"]["trace_id"]) == 32
    assert first["spans"] == [first["span"]]
    assert "span" not in lines[1]  # logged after the span ended
    assert "ValueError" in lines[1]["exception"] and KEY not in text


def test_disable_spans_leaves_span_fields_out() -> None:
    settings = Settings.single("m", json_output=True, disable_spans=True, api_key=KEY)
    first = json.loads(emit(settings, traced=True).splitlines()[0])
    assert "span" not in first and "spans" not in first
    assert trace.get_current_span().is_recording() is False


def test_text_lines_are_redacted_too() -> None:
    text = emit(Settings.single("m", hf_token=KEY), traced=False)
    assert KEY not in text and REDACTED in text
    assert "WARNING vectorpress.test: request with <redacted> inputs=3" in text
