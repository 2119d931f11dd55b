"""Which module folders the Hub download fetches, read from modules.json as model_spec reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vectorpress.errors import StartupError
from vectorpress.hub import module_folders

TRANSFORMER = {"path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
DENSE = {"path": "2_Dense", "type": "sentence_transformers.models.Dense"}
NORMALIZE = {"path": "3_Normalize", "type": "sentence_transformers.models.Normalize"}
PYLATE = {"path": "1_Dense", "type": "pylate.models.Dense.Dense"}


def folders(tmp_path: Path, modules: object, dense_path: str | None = None) -> object:
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    return module_folders(tmp_path, dense_path)


@pytest.mark.parametrize(
    ("modules", "dense_path", "want"),
    [
        ([TRANSFORMER, POOLING], None, (["1_Pooling"], [])),
        (
            [TRANSFORMER, POOLING, DENSE, NORMALIZE],
            None,
            (["1_Pooling", "2_Dense", "3_Normalize"], ["2_Dense"]),
        ),
        ([TRANSFORMER, PYLATE], None, (["1_Dense"], ["1_Dense"])),
        # stella: --dense-path stands in for the one Dense listed.
        (
            [TRANSFORMER, POOLING, DENSE],
            "2_Dense_256/",
            (["1_Pooling", "2_Dense_256"], ["2_Dense_256"]),
        ),
        ([TRANSFORMER, POOLING], "2_Dense_256", (["1_Pooling", "2_Dense_256"], ["2_Dense_256"])),
        # With several Dense modules listed, model_spec ignores --dense-path: so does the download.
        (
            [TRANSFORMER, DENSE, {**DENSE, "path": "3_Dense"}],
            "2_Dense_256",
            (["2_Dense", "3_Dense"], ["2_Dense", "3_Dense"]),
        ),
    ],
)
def test_module_folders(
    tmp_path: Path, modules: list[dict[str, str]], dense_path: str | None, want: object
) -> None:
    assert folders(tmp_path, modules, dense_path) == want


def test_no_modules_json_and_a_broken_one(tmp_path: Path) -> None:
    assert module_folders(tmp_path) == ([], [])
    (tmp_path / "modules.json").write_text("[{")
    with pytest.raises(StartupError, match=r"modules\.json"):
        module_folders(tmp_path)
