"""`vectorpress serve` as a subprocess: JSON log lines without secrets, the metrics listener."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.helpers.process import ServerProcess, free_port, run_to_exit
from tests.observability.scrape import scrape

API_KEY = "sk-observability-api-key-1234"
HF_TOKEN = "hf_observabilityTokenDoNotLog"


def test_json_output_lines_metrics_port_and_no_secrets(
    tiny_bert_family: Callable[..., Path], tmp_path: Path
) -> None:
    folder = tiny_bert_family("bert", "embedding", "mean")
    metrics_port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LOG_LEVEL": "info"}
    env.pop("API_KEY", None)
    args = ["--model-id", str(folder), "--prometheus-port", str(metrics_port), "--json-output"]
    args += ["--api-key", API_KEY, "--hf-token", HF_TOKEN]
    with ServerProcess(args, env=env, logs=tmp_path) as srv:  # waits for /health, keyless
        url = srv.url
        refused = httpx.post(f"{url}/embed", json={"inputs": "no key"}, timeout=30)
        assert refused.status_code == 401
        wrong = httpx.post(
            f"{url}/embed",
            json={"inputs": "a wrong key"},
            headers={"Authorization": f"Bearer {API_KEY}x"},
            timeout=30,
        )
        assert wrong.status_code == 401
        auth = {"Authorization": f"Bearer {API_KEY}"}
        for text in ("one", "two", "three"):
            ok = httpx.post(f"{url}/embed", json={"inputs": text}, headers=auth, timeout=30)
            assert ok.status_code == 200
        bad = httpx.post(f"{url}/embed", json={"inputs": ""}, headers=auth, timeout=30)
        assert bad.status_code == 400

        # The separate listener answers on any path, without a key, with the same registry.
        for path in ("/metrics", "/"):
            page = scrape(f"http://127.0.0.1:{metrics_port}{path}")
            assert page.get("te_request_count", method="single") == 4
            assert page.get("te_embed_success") == 3
            # An empty input fails while tokenizing: TEI counts that stage, not the kind.
            assert page.get("te_request_failure", err="tokenization") == 1
        assert scrape(f"{url}/metrics").get("te_embed_success") == 3
    assert srv.stop() == 0, srv.stderr_path.read_text()

    stdout_text, stderr_text = srv.stdout_path.read_text(), srv.stderr_path.read_text()
    for secret in (API_KEY, HF_TOKEN):
        assert secret not in stdout_text and secret not in stderr_text
    lines = [line for line in stdout_text.splitlines() if line.strip()]
    assert len(lines) >= 3
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    for record in records:
        assert isinstance(record, dict)
        assert {"timestamp", "level", "message", "target"} <= set(record)
        assert record["timestamp"].endswith("Z")
        assert record["level"] in {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}

    settings = next(r for r in records if r["message"] == "settings")["fields"]["settings"]
    server, (model,) = settings["server"], settings["models"]
    assert server["api_key"] == "<redacted>" and model["hf_token"] == "<redacted>"
    assert server["json_output"] is True and server["prometheus_port"] == metrics_port

    messages = [r["message"] for r in records]
    loaded = messages.index("model loaded and warmed up")
    ready = next(i for i, m in enumerate(messages) if m.startswith("Ready"))
    assert loaded < ready, "the socket must open only after the model is loaded and warm"
    # What start-up made is kept out of the collector's full passes (server.py says why).
    assert records[ready]["fields"]["gc_frozen_objects"] > 50_000
    assert records[loaded]["filename"] == "vectorpress/server.py"
    assert not any("color_message" in r.get("fields", {}) for r in records)
    fields = records[loaded]["fields"]
    assert fields["model"] == str(folder)
    assert fields["backend"] == "torch" and fields["dtype"] == "float32"
    assert fields["device"] == "cpu" and fields["max_input_length"] == 128
    assert fields["max_batch_tokens"] == 16384 and fields["max_concurrent_requests"] == 512
    assert "max_batch_requests" in fields
    assert not any("not honoured" in m for m in messages)


def test_a_taken_prometheus_port_stops_start_up_with_one_line(
    tiny_bert_family: Callable[..., Path],
) -> None:
    folder = tiny_bert_family("bert", "embedding", "mean")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = run_to_exit(
            ["--model-id", str(folder), "--prometheus-port", str(taken.getsockname()[1])],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--prometheus-port" in lines[0], proc.stderr
