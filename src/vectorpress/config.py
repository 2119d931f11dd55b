"""`--config models.toml`: the served models and each one's settings.

```toml
[[models]]
model_id = "sentence-transformers/all-MiniLM-L6-v2"
served_model_name = "minilm"
aliases = ["embedder"]
max_batch_tokens = 8192

[[models]]
model_id = "/srv/models/reranker"
served_model_name = "reranker"
```

Each table takes ModelSettings' fields (dashes or underscores, as the flags spell them). What a
table leaves out comes from the command line and environment, so `--dtype` or `MAX_BATCH_TOKENS`
still set every model's default. Server-wide settings (ports, keys, limits, telemetry) stay
flags. Anything unknown, of the wrong type or that does not parse stops start-up with one line.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, cast

from vectorpress.errors import StartupError
from vectorpress.settings import ModelSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - the conditional dependency of Python 3.10
    import tomli as tomllib

_TYPES: dict[str, tuple[type, ...]] = {}
for _f in fields(ModelSettings):
    _kind = str(_f.type)
    if _kind.startswith("int"):
        _TYPES[_f.name] = (int,)
    elif _kind.startswith("bool"):
        _TYPES[_f.name] = (bool,)
    elif _kind.startswith("tuple"):
        _TYPES[_f.name] = (list,)
    else:
        _TYPES[_f.name] = (str,)


def read_config(path: str | Path, defaults: Mapping[str, Any]) -> tuple[ModelSettings, ...]:
    """The models of a config file, each table over `defaults` (ModelSettings field values the
    command line and environment gave)."""
    where = str(path)
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise StartupError(f"--config {where}: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise StartupError(f"--config {where} is not valid TOML: {exc}") from None
    unknown = set(data) - {"models"}
    if unknown:
        raise StartupError(
            f"--config {where}: unknown top-level key {sorted(unknown)[0]!r}; "
            "give the models as [[models]] tables"
        )
    tables = data.get("models")
    if not isinstance(tables, list) or not tables:
        raise StartupError(f"--config {where}: no [[models]] table")
    return tuple(_model(where, i, table, defaults) for i, table in enumerate(tables, 1))


def _model(where: str, index: int, table: Any, defaults: Mapping[str, Any]) -> ModelSettings:
    if not isinstance(table, dict):
        raise StartupError(f"--config {where}: models entry {index} is not a table")
    label = f"--config {where}, model {index}"
    values = dict(defaults)
    value: Any
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in _TYPES:
            known = ", ".join(sorted(_TYPES))
            raise StartupError(f"{label}: unknown key {key!r}; the keys are: {known}")
        expected = _TYPES[name]
        # TOML booleans are not integers here, though Python's bool is an int.
        if not isinstance(value, expected) or (expected == (int,) and isinstance(value, bool)):
            raise StartupError(f"{label}: {key} must be {_type_name(expected[0])}, got {value!r}")
        if name == "aliases":
            aliases = cast(list[Any], value)
            if not all(isinstance(a, str) for a in aliases):
                raise StartupError(f"{label}: aliases must be a list of strings")
            value = tuple(aliases)
        if name == "pooling":
            value = value.replace("-", "_")
        values[name] = value
    if "model_id" not in table and "model-id" not in table:
        raise StartupError(f"{label}: model_id is required")
    if "served_model_name" not in table and "served-model-name" not in table:
        values["served_model_name"] = None  # a name given on the command line is not its own
    model_id = values.pop("model_id")
    try:
        return ModelSettings(model_id, **values)
    except StartupError as exc:
        raise StartupError(f"{label}: {exc}") from None


def _type_name(kind: type) -> str:
    return {int: "an integer", bool: "a boolean", list: "a list", str: "a string"}[kind]
