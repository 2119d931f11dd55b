"""Command line: TEI's flags, each also read from TEI's environment variable."""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from vectorpress import __version__
from vectorpress.errors import StartupError
from vectorpress.settings import (
    ModelSettings,
    ServerSettings,
    Settings,
    default_tokenization_workers,
    model_fields,
    server_fields,
)

log = logging.getLogger("vectorpress")

#: Flags that are parsed for compatibility but do nothing yet; start-up warns when one is set.
NOT_YET_HONOURED: tuple[str, ...] = ()

#: The name the bundled default model goes by, as on the Hub.
BUNDLED_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None


def _float(value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None


def _pooling(value: str) -> str:
    return value.replace("-", "_")


# (flag, env var, type, default, help); type None = string, bool flags take an optional value.
_FLAGS: list[tuple[str, str, Callable[[str], Any] | type[bool] | None, Any, str]] = [
    (
        "--model-id",
        "MODEL_ID",
        None,
        None,
        "Hub repo id or local folder; repeat the flag (or give a comma-separated list) to serve "
        "several models, the first being the default (default: the bundled all-MiniLM-L6-v2 "
        "when installed)",
    ),
    (
        "--config",
        "VECTORPRESS_CONFIG",
        None,
        None,
        "A TOML file of [[models]] tables, one per served model, with its own settings",
    ),
    ("--revision", "REVISION", None, None, "Hub branch, tag or commit"),
    (
        "--tokenization-workers",
        "TOKENIZATION_WORKERS",
        _int,
        None,
        "Tokenizer threads (default: cores - 1, at least 1)",
    ),
    (
        "--dtype",
        "DTYPE",
        None,
        None,
        "float32, float16, bfloat16, int8 (on the CPU: torch or onnx backend) or auto "
        "(bfloat16 where the CPU has AVX512-BF16/AMX and the model's vectors hold it, "
        "checked at start-up; else float32, or the GPU's default)",
    ),
    (
        "--served-model-name",
        "SERVED_MODEL_NAME",
        None,
        None,
        "Name clients route by and see; with several --model-id, one per model, by position",
    ),
    ("--pooling", "POOLING", _pooling, None, "cls, mean, splade or last-token"),
    (
        "--max-concurrent-requests",
        "MAX_CONCURRENT_REQUESTS",
        _int,
        512,
        "Admission permits, one per input",
    ),
    ("--max-batch-tokens", "MAX_BATCH_TOKENS", _int, 16384, "Token budget of one batch"),
    ("--max-batch-requests", "MAX_BATCH_REQUESTS", _int, None, "Most inputs in one batch"),
    ("--max-client-batch-size", "MAX_CLIENT_BATCH_SIZE", _int, 32, "Most inputs in one request"),
    (
        "--auto-truncate",
        "AUTO_TRUNCATE",
        bool,
        True,
        "Truncate inputs over the limit when the request does not say",
    ),
    (
        "--default-prompt-name",
        "DEFAULT_PROMPT_NAME",
        None,
        None,
        "Prompt of config_sentence_transformers.json applied by default",
    ),
    ("--default-prompt", "DEFAULT_PROMPT", None, None, "Prompt text applied by default"),
    ("--dense-path", "DENSE_PATH", None, None, "Dense module folder to use"),
    (
        "--windowed-inputs",
        "WINDOWED_INPUTS",
        bool,
        False,
        "Embed inputs longer than the model's window as pooled overlapping windows",
    ),
    ("--window-overlap", "WINDOW_OVERLAP", _int, 0, "Tokens shared by consecutive windows"),
    (
        "--llm-reranker",
        "LLM_RERANKER",
        bool,
        None,
        "Serve a causal LM as a reranker (default: when its name contains `rerank`)",
    ),
    ("--reranker-prefix", "RERANKER_PREFIX", None, None, "LLM reranker: text before a pair"),
    (
        "--reranker-template",
        "RERANKER_TEMPLATE",
        None,
        None,
        "LLM reranker: a pair's text, with {query}, {document} and {instruction}",
    ),
    ("--reranker-suffix", "RERANKER_SUFFIX", None, None, "LLM reranker: text after a pair"),
    (
        "--reranker-instruction",
        "RERANKER_INSTRUCTION",
        None,
        None,
        "LLM reranker: the template's {instruction}",
    ),
    (
        "--reranker-tokens",
        "RERANKER_TOKENS",
        None,
        None,
        "LLM reranker: answer tokens, `yes,no` or one token",
    ),
    ("--hf-token", "HF_TOKEN", None, None, "Hub token"),
    ("--hostname", "HOSTNAME", None, "0.0.0.0", "Address to bind"),
    ("--port", "PORT", _int, 8080, "HTTP port"),
    ("--huggingface-hub-cache", "HUGGINGFACE_HUB_CACHE", None, None, "Download cache folder"),
    ("--payload-limit", "PAYLOAD_LIMIT", _int, 2_000_000, "Largest request body in bytes"),
    ("--api-key", "API_KEY", None, None, "Bearer key for protected routes"),
    ("--json-output", "JSON_OUTPUT", bool, False, "JSON log lines"),
    ("--disable-spans", "DISABLE_SPANS", bool, False, "Leave spans out of JSON logs"),
    ("--otlp-endpoint", "OTLP_ENDPOINT", None, None, "OTLP/gRPC trace endpoint"),
    (
        "--otlp-service-name",
        "OTLP_SERVICE_NAME",
        None,
        "text-embeddings-inference.server",
        "OpenTelemetry service name",
    ),
    ("--prometheus-port", "PROMETHEUS_PORT", _int, None, "Also serve /metrics on this port"),
    (
        "--cors-allow-origin",
        "CORS_ALLOW_ORIGIN",
        None,
        None,
        "Allowed CORS origin (repeat the flag; default any)",
    ),
    ("--backend", "BACKEND", None, "auto", "auto, torch, hf, onnx or openvino"),
    ("--device", "DEVICE", None, "auto", "auto, cpu or cuda"),
    (
        "--cuda-graphs",
        "CUDA_GRAPHS",
        bool,
        True,
        "On a GPU, replay the native encoder from CUDA graphs where the model allows",
    ),
    ("--grpc-port", "GRPC_PORT", _int, None, "Also serve TEI's gRPC API on this port"),
    (
        "--grpc-max-parallel-stream-requests",
        "GRPC_MAX_PARALLEL_STREAM_REQUESTS",
        _int,
        1024,
        "Most messages of one gRPC stream in flight",
    ),
    (
        "--max-total-concurrent-requests",
        "MAX_TOTAL_CONCURRENT_REQUESTS",
        _int,
        None,
        "Admission permits across every model, one per input (default: each model's only)",
    ),
    (
        "--interactive-max-inputs",
        "INTERACTIVE_MAX_INPUTS",
        _int,
        32,
        "Most inputs of a request that is interactive by default",
    ),
    (
        "--interactive-max-tokens",
        "INTERACTIVE_MAX_TOKENS",
        _int,
        2048,
        "Most tokens of a request that is interactive by default",
    ),
    (
        "--bulk-pass-tokens",
        "BULK_PASS_TOKENS",
        _int,
        None,
        "Most tokens of one bulk unit (default: 4096 on CPU, the batch budget elsewhere)",
    ),
    (
        "--scheduler-weight",
        "SCHEDULER_WEIGHT",
        _float,
        1.0,
        "The model's share of the device against others with bulk work",
    ),
    (
        "--preemption",
        "PREEMPTION",
        bool,
        True,
        "Run waiting interactive work between the layers of a bulk batch",
    ),
    (
        "--device-runners",
        "DEVICE_RUNNERS",
        _int,
        0,
        "Units run side by side on the CPU, each on a share of its threads (0: auto, 1: off)",
    ),
]


#: Flags given once per value, or as one comma-separated environment variable.
_LISTS = ("--cors-allow-origin", "--model-id", "--served-model-name")


class _ArgParser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2, no usage dump
        sys.stderr.write(f"vectorpress: error: {message}\n")
        raise SystemExit(2)


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = _ArgParser(prog="vectorpress", description="TEI-compatible inference server")
    parser.add_argument("-V", "--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_ArgParser)
    serve = sub.add_parser("serve", help="Serve a model over HTTP")
    # Parsed by vectorpress.jobs.command; listed here for `vectorpress --help`.
    sub.add_parser(
        "embed", help="Embed files into Parquet shards (locally or on Ray)", add_help=False
    )
    for flag, var, kind, default, help_text in _FLAGS:
        dest = flag.lstrip("-").replace("-", "_")
        raw = env.get(var)
        names = ("-p", flag) if flag == "--port" else (flag,)
        if kind is bool:
            value = default if raw is None else _env(raw, _bool, var)
            serve.add_argument(
                *names,
                dest=dest,
                nargs="?",
                const=True,
                type=_bool,
                default=value,
                metavar="true|false",
                help=f"{help_text} [env {var}]",
            )
        elif flag in _LISTS:
            value = None if raw is None else [o.strip() for o in raw.split(",") if o.strip()]
            serve.add_argument(
                flag, dest=dest, action="append", default=None, help=f"{help_text} [env {var}]"
            )
            serve.set_defaults(**{f"_{dest}_env": value})
        else:
            conv = kind or str
            value = default if raw is None else _env(raw, conv, var)
            serve.add_argument(
                *names, dest=dest, type=conv, default=value, help=f"{help_text} [env {var}]"
            )
    return parser


def _env(raw: str, conv: Callable[[str], Any], var: str) -> Any:
    try:
        return conv(raw)
    except argparse.ArgumentTypeError as exc:
        raise StartupError(f"environment variable {var}: {exc}") from None


def settings_from_args(
    argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None
) -> Settings:
    env = os.environ if env is None else env
    args = build_parser(env).parse_args(argv)
    values = vars(args)
    values.pop("command")
    lists = {}
    for flag in _LISTS:
        dest = flag.lstrip("-").replace("-", "_")
        from_env = values.pop(f"_{dest}_env", None)
        lists[dest] = values.pop(dest) or from_env
    cors = lists["cors_allow_origin"]
    values["cors_allow_origin"] = tuple(cors) if cors is not None else None
    if values["tokenization_workers"] is None:
        values["tokenization_workers"] = default_tokenization_workers()
    if values["hf_token"] is None and env.get("HF_API_TOKEN"):
        values["hf_token"] = env["HF_API_TOKEN"]
    # TEI has no flag for this; the HF inference containers set TASK.
    values["task"] = env.get("TASK") or None
    config = values.pop("config")
    server = ServerSettings(**{k: v for k, v in values.items() if k in server_fields()})
    common = {k: v for k, v in values.items() if k in model_fields()}
    ids: list[str] = lists["model_id"] or []
    names: list[str] = lists["served_model_name"] or []
    if config is not None:
        if args_given(argv, "--model-id"):
            raise StartupError("give the models with --model-id or with --config, not both")
        from vectorpress.config import read_config

        return Settings(server, read_config(config, common))
    if not ids:
        from vectorpress.hub import bundled_model_path

        bundled = bundled_model_path()
        ids = [str(bundled) if bundled else ""]
        if bundled and not names:
            names = [BUNDLED_MODEL_NAME]
    if len(names) > len(ids):
        raise StartupError(
            f"{len(names)} --served-model-name for {len(ids)} --model-id: give at most one "
            "name per model, in the same order"
        )
    models = tuple(
        ModelSettings(
            **{**common, "model_id": model_id, "served_model_name": name},
        )
        for model_id, name in zip(ids, [*names, *[None] * (len(ids) - len(names))], strict=True)
    )
    return Settings(server, models)


def args_given(argv: Sequence[str] | None, flag: str) -> bool:
    """Whether `flag` is on the command line itself (not from the environment)."""
    given = sys.argv[1:] if argv is None else argv
    return any(a == flag or a.startswith(flag + "=") for a in given)


def configure_logging(settings: Settings) -> None:
    """Plain or JSON lines on stdout (LOG_LEVEL sets the level); secrets never appear."""
    from vectorpress.observability.logging import configure

    configure(settings, level=os.environ.get("LOG_LEVEL", "info"))
    log.info("settings", extra={"settings": settings.redacted()})


def warn_unhonoured(settings: Settings) -> None:
    defaults = Settings.single("x")
    for name in NOT_YET_HONOURED:
        for scope, default in (
            (settings.server, defaults.server),
            (settings.model, defaults.model),
        ):
            if hasattr(scope, name) and getattr(scope, name) != getattr(default, name):
                log.warning("--%s is accepted but not honoured yet", name.replace("_", "-"))


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # A crash in native code (a kernel, a library's thread at exit) leaves every thread's Python
    # stack on stderr rather than a bare exit status. (No stderr with a file behind it: none.)
    with contextlib.suppress(RuntimeError, ValueError, OSError):
        faulthandler.enable()
    if argv[:1] == ["embed"]:
        from vectorpress.jobs.command import main as embed

        return embed(argv[1:])
    try:
        settings = settings_from_args(argv)
        configure_logging(settings)
        warn_unhonoured(settings)
        from vectorpress.server import exit_after_stop, run

        run(settings)
        exit_after_stop(0)
    except StartupError as exc:
        sys.stderr.write(f"vectorpress: error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 0
    return 0
