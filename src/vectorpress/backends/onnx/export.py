"""Export a checkpoint to an ONNX graph that --backend onnx serves.

`--backend onnx` on a checkpoint that ships no graph exports one on its first start and keeps
it in the model cache (`cached_graph`); later starts read it from there. By hand:

    python -m vectorpress.backends.onnx.export MODEL_FOLDER OUT_FOLDER

OUT_FOLDER gets model.onnx (fp32, dynamic batch and length) next to links to the model's
config, tokenizer and sentence-transformers files, so it can be served as it is. Needs the
`onnx` package and transformers.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import inspect
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from vectorpress.errors import StartupError

log = logging.getLogger(__name__)

GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
OPSET = 17
#: Changes whenever what `export_encoder` writes changes: part of the cache key, as the exporter's
#: and torch's versions are, so that a graph exported by older code is not served as current.
EXPORT = "eager-attention-v1"
#: Files whose change makes a cached graph stale (weights in one file or in shards).
_SOURCES = ("config.json", "model*.safetensors", "pytorch_model*.bin")


def export_encoder(
    model_folder: Path, graph: Path, opset: int = OPSET, kind: str = "embedding"
) -> Path:
    """Trace transformers' model into `graph`.

    Embedding models (SPLADE ones too: their head runs outside the graph) give
    `last_hidden_state`; classifiers and rerankers their sequence-classification head's
    `logits`; `mlm` the masked-LM head's `logits` for every token (a SPLADE graph as other
    exporters write one). `token_type_ids` is an input only where the architecture takes one.
    """
    from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification

    auto = {"embedding": AutoModel, "mlm": AutoModelForMaskedLM}.get(
        kind, AutoModelForSequenceClassification
    )
    model = auto.from_pretrained(str(model_folder), attn_implementation="eager").eval()
    output = "last_hidden_state" if kind == "embedding" else "logits"
    per_token = kind in ("embedding", "mlm")
    names = [n for n in GRAPH_INPUTS if n in inspect.signature(model.forward).parameters]

    class Graph(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            return getattr(self.model(**dict(zip(names, inputs, strict=True))), output)

    ids = torch.ones(2, 7, dtype=torch.long)
    example = {"input_ids": ids, "attention_mask": ids, "token_type_ids": torch.zeros_like(ids)}
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes[output] = {0: "batch", 1: "sequence"} if per_token else {0: "batch"}
    graph.parent.mkdir(parents=True, exist_ok=True)
    with _masks_by_broadcasting():
        torch.onnx.export(
            Graph(),
            tuple(example[n] for n in names),
            str(graph),
            input_names=names,
            output_names=[output],
            dynamic_axes=axes,
            dynamo=False,
            opset_version=opset,
        )
    return graph


@contextlib.contextmanager
def _masks_by_broadcasting() -> Iterator[None]:
    """transformers builds attention masks that deviate from plain causal ones (Gemma 3's
    bidirectional sliding windows, as EmbeddingGemma's) with torch.vmap, which the TorchScript
    exporter cannot trace ("unordered_map::at"). Their mask functions are index arithmetic that
    broadcasts as well, so while exporting they are evaluated that way: the graph is checked
    against transformers' own outputs in the tests."""
    try:
        from transformers import masking_utils
    except ImportError:  # older transformers: no such masks
        yield
        return
    original = masking_utils.sdpa_mask

    def broadcast(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **{**kwargs, "use_vmap": False})

    masking_utils.sdpa_mask = broadcast
    try:
        yield
    finally:
        masking_utils.sdpa_mask = original


def fingerprint(model_folder: Path, kind: str) -> str:
    """What a cached graph was made from: the folder, its config and weights files (size and
    modification time, not their bytes), the head, and the exporter's versions (torch's,
    transformers', the opset and EXPORT)."""
    parts: list[object] = [str(model_folder.resolve()), kind, torch.__version__, OPSET, EXPORT]
    with contextlib.suppress(PackageNotFoundError):  # the traced code is transformers'
        parts.append(version("transformers"))
    for pattern in _SOURCES:
        for path in sorted(model_folder.glob(pattern)):
            stat = path.stat()
            parts.append((path.name, stat.st_size, stat.st_mtime_ns))
    digest = hashlib.sha256(json.dumps(parts).encode()).hexdigest()
    return digest[:20]


def cached_graph(model_folder: Path, kind: str, cache: Path) -> Path:
    """`model_folder`'s graph under `cache`, exported on the first call."""

    def export(graph: Path) -> None:
        log.info("%s ships no ONNX graph: exporting it once into %s", model_folder, cache)
        export_encoder(model_folder, graph, kind=kind)

    return build_once(
        cache / fingerprint(model_folder, kind),
        export,
        f"cannot export {model_folder} to ONNX",
        "give a folder with model.onnx, or serve it with --backend torch",
    )


def graph_stamp(graph: Path) -> list[object]:
    """What a graph built from `graph` depends on of it, for its cache key: the path, size and
    modification time, and those of its external data file where it has one."""
    stat = graph.stat()
    parts: list[object] = [str(graph.resolve()), stat.st_size, stat.st_mtime_ns]
    for data in sorted(graph.parent.glob(graph.name + "?data")):  # model.onnx_data, .onnx.data
        parts.append((data.name, data.stat().st_size, data.stat().st_mtime_ns))
    return parts


def run_graph(session: Any, names: list[str] | None, feed: dict[str, Any]) -> list[Any]:
    """`names` (None: every output) on `feed`, of which the graph gets the inputs it declares."""
    inputs = {i.name for i in session.get_inputs()}
    return list(session.run(names, {k: v for k, v in feed.items() if k in inputs}))


def build_once(final: Path, build: Callable[[Path], None], failed: str, advice: str) -> Path:
    """`final / "model.onnx"`, made by `build` on the first call and read from there after.

    The graph is built in a folder of its own and renamed into place when complete, so a crash
    or a second server building the same graph at once never leaves a partial one behind.
    """
    graph = final / "model.onnx"
    if graph.is_file():
        log.info("onnx graph from the cache: %s", graph)
        return graph
    cache = final.parent
    work = cache / f"{final.name}.partial-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    started = time.perf_counter()
    try:
        work.mkdir(parents=True)  # a read-only cache fails here, as a StartupError
        build(work / "model.onnx")
    except StartupError:
        shutil.rmtree(work, ignore_errors=True)
        raise
    except Exception as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise StartupError(f"{failed} ({type(exc).__name__}: {exc}); {advice}") from exc
    try:
        os.replace(work, final)
    except OSError:  # another process finished the same graph first: keep its own
        shutil.rmtree(work, ignore_errors=True)
        if not graph.is_file():
            raise
    log.info("%s built in %.1f s", graph, time.perf_counter() - started)
    with contextlib.suppress(OSError):  # work folders of builds that died a day ago or more
        for stale in cache.glob("*.partial-*"):
            if time.time() - stale.stat().st_mtime > 24 * 3600:
                shutil.rmtree(stale, ignore_errors=True)
    return graph


def servable_folder(model_folder: Path, graph: Path, dest: Path) -> Path:
    """`dest` with links to the model's files (weights left out) and `graph` as model.onnx."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in model_folder.iterdir():
        link = dest / item.name
        if item.suffix not in (".safetensors", ".bin", ".onnx") and not link.exists():
            link.symlink_to(item.resolve())
    target = dest / "model.onnx"
    if not target.exists():
        target.symlink_to(graph.resolve())
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--kind", choices=("embedding", "classifier", "mlm"), default="embedding")
    args = ap.parse_args()
    graph = export_encoder(args.model, args.out / "graph" / "model.onnx", kind=args.kind)
    print(servable_folder(args.model, graph, args.out))


if __name__ == "__main__":
    main()
