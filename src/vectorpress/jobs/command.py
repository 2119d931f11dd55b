"""`vectorpress embed`: the command line of a batch job (the model flags are `serve`'s)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from vectorpress.errors import JobError, StartupError
from vectorpress.jobs.encodings import ENCODINGS
from vectorpress.jobs.inputs import FORMATS, Columns, find_inputs
from vectorpress.jobs.spec import AUTO_DTYPE, TASKS, JobSpec
from vectorpress.settings import ModelSettings

log = logging.getLogger("vectorpress.jobs")

#: (flag, Settings field, type, help): the model options of `serve` that apply to a job.
MODEL_FLAGS: list[tuple[str, str, Any, str]] = [
    ("--model-id", "model_id", str, "Hub repo id or local folder (default: the bundled model)"),
    ("--revision", "revision", str, "Hub branch, tag or commit"),
    ("--dtype", "dtype", str, "float32, float16, bfloat16 or int8 (not auto)"),
    ("--pooling", "pooling", lambda v: v.replace("-", "_"), "cls, mean, splade or last-token"),
    ("--backend", "backend", str, "auto, torch, hf or onnx"),
    ("--device", "device", str, "auto, cpu or cuda"),
    ("--max-batch-tokens", "max_batch_tokens", int, "Token budget of one batch"),
    ("--max-batch-requests", "max_batch_requests", int, "Most inputs in one batch"),
    ("--tokenization-workers", "tokenization_workers", int, "Tokenizer threads"),
    ("--default-prompt-name", "default_prompt_name", str, "Prompt applied by default"),
    ("--default-prompt", "default_prompt", str, "Prompt text applied by default"),
    ("--dense-path", "dense_path", str, "Dense module folder to use"),
    ("--hf-token", "hf_token", str, "Hub token"),
    ("--huggingface-hub-cache", "huggingface_hub_cache", str, "Download cache folder"),
]


def build_parser() -> argparse.ArgumentParser:
    from vectorpress.cli import _ArgParser

    p = _ArgParser(
        prog="vectorpress embed",
        description="Embed files (Parquet, JSONL, CSV, text, or an OpenAI batch file) into "
        "Parquet shards with a manifest; a rerun resumes.",
    )
    p.add_argument("inputs", nargs="+", help="files, folders or globs")
    p.add_argument(
        "-o", "--output", required=True, help="output folder (or .jsonl for openai-batch)"
    )
    p.add_argument("--format", default="auto", choices=("auto", *FORMATS, "openai-batch"))
    p.add_argument("--text-column", default="text", help="column (or JSON field) of the text")
    p.add_argument("--pair-column", help="second text of a pair, for rerank/classify models")
    p.add_argument("--id-column", help="a column passed through to the output")
    p.add_argument("--task", default="auto", choices=TASKS, help="default: from the model")
    p.add_argument("--encoding", default="float32", choices=ENCODINGS)
    p.add_argument("--no-normalize", dest="normalize", action="store_false")
    p.add_argument("--dimensions", type=int, help="Matryoshka: keep the first N dimensions")
    p.add_argument("--prompt-name", help="prompt of config_sentence_transformers.json")
    trunc = p.add_mutually_exclusive_group()
    trunc.add_argument("--truncate", dest="truncate", action="store_true", default=None)
    trunc.add_argument(
        "--no-truncate", dest="truncate", action="store_false", help="reject over-long rows"
    )
    p.add_argument("--shard-rows", type=int, default=10_000, help="rows per output shard")
    p.add_argument("--block-rows", type=int, default=1024, help="rows read at a time")
    p.add_argument("--threads", type=int, help="torch threads (default: every core)")
    p.add_argument("--progress", default="auto", choices=("auto", "bar", "log", "none"))
    ray = p.add_argument_group("Ray")
    ray.add_argument("--ray-address", help="run on this Ray cluster (e.g. auto, 10.0.0.1:6379)")
    ray.add_argument("--actors", type=int, default=1, help="engine actors (Ray)")
    ray.add_argument("--cpus-per-actor", type=float, default=1.0)
    ray.add_argument("--gpus-per-actor", type=float, default=0.0)
    model = p.add_argument_group("model (as `vectorpress serve`)")
    for flag, dest, kind, help_text in MODEL_FLAGS:
        model.add_argument(flag, dest=dest, type=kind, default=None, help=help_text)
    return p


def model_settings(args: argparse.Namespace) -> ModelSettings:
    from vectorpress.engine import engine_settings

    options = {dest: getattr(args, dest) for _, dest, _, _ in MODEL_FLAGS}
    if options["dtype"] == "auto":
        raise JobError(AUTO_DTYPE)
    model_id = options.pop("model_id")
    # Jobs send any number of inputs per call; the engine cuts them into requests this size.
    options["max_client_batch_size"] = 256
    return engine_settings(model_id, **{k: v for k, v in options.items() if v is not None})


def main(argv: Sequence[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("LOG_LEVEL", "info").upper(),
        format="%(asctime)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = model_settings(args)
        if args.format == "openai-batch":
            from vectorpress.engine import Engine
            from vectorpress.jobs.openai_batch import run_openai_batch

            if len(args.inputs) != 1:
                raise StartupError("an OpenAI batch job reads one file")
            with Engine(settings=settings, threads=args.threads) as engine:
                summary = run_openai_batch(args.inputs[0], args.output, engine)
            sys.stderr.write(summary + "\n")
            return 0
        job = JobSpec(
            inputs=tuple(str(p) for p in find_inputs(args.inputs)),
            output=args.output,
            columns=Columns(args.text_column, args.pair_column, args.id_column),
            format=args.format,
            task=args.task,
            encoding=args.encoding,
            normalize=args.normalize,
            dimensions=args.dimensions,
            prompt_name=args.prompt_name,
            truncate=args.truncate,
            shard_rows=args.shard_rows,
            block_rows=args.block_rows,
        )
        job.formats()  # an unknown format fails before the model loads
        if args.ray_address:
            from vectorpress.jobs.ray_job import RayOptions, run_ray

            result = run_ray(
                job,
                settings,
                RayOptions(
                    address=args.ray_address,
                    actors=args.actors,
                    cpus_per_actor=args.cpus_per_actor,
                    gpus_per_actor=args.gpus_per_actor,
                    threads=args.threads,
                ),
                progress=args.progress,
            )
        else:
            from vectorpress.engine import Engine
            from vectorpress.jobs.local import run_local

            with Engine(settings=settings, threads=args.threads) as engine:
                result = run_local(job, engine, progress=args.progress)
        sys.stderr.write(result.line() + "\n")
    except StartupError as exc:
        sys.stderr.write(f"vectorpress embed: error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
