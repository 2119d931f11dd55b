"""Input files of a batch job, read as a stream of bounded blocks of rows.

Parquet and CSV go through pyarrow's streaming readers (record batches of `block_rows`); JSONL
and plain text are read line by line, because one malformed line must become one rejected row,
not a failed block. Whatever the corpus size, memory holds one block and the shard in hand.

A row is a text (or a text and its pair) and an id. A value that cannot be embedded (null, not
a string, empty, a line that is not JSON) is kept as an `Invalid` so that the shard writes it to
the rejects file with its reason, at its own row number.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from vectorpress.errors import JobError

FORMATS = ("parquet", "jsonl", "csv", "text")
_SUFFIXES = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".txt": "text",
    ".text": "text",
}


@dataclass(frozen=True)
class Invalid:
    """A value that cannot be embedded, and why."""

    reason: str


@dataclass(frozen=True)
class Columns:
    """Which input columns hold the text, the optional pair text and the optional id."""

    text: str = "text"
    pair: str | None = None
    id: str | None = None


@dataclass
class Block:
    """Consecutive rows of one file: raw values, checked later by the shard."""

    texts: list[Any]
    pairs: list[Any] | None
    ids: list[Any] | None

    def __len__(self) -> int:
        return len(self.texts)

    def extend(self, other: Block) -> None:
        self.texts.extend(other.texts)
        if self.pairs is not None and other.pairs is not None:
            self.pairs.extend(other.pairs)
        if self.ids is not None and other.ids is not None:
            self.ids.extend(other.ids)

    def slice(self, start: int, stop: int) -> Block:
        return Block(
            self.texts[start:stop],
            None if self.pairs is None else self.pairs[start:stop],
            None if self.ids is None else self.ids[start:stop],
        )


def find_inputs(patterns: Sequence[str]) -> list[Path]:
    """Files named by paths, folders (their files, sorted) or globs, in a stable order."""
    files: list[Path] = []
    for pattern in patterns:
        path = Path(pattern)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _SUFFIXES)
        elif path.is_file():
            found = [path]
        else:
            found = sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
        if not found:
            raise JobError(f"no input files at {pattern!r}")
        files.extend(found)
    seen: set[Path] = set()
    unique = []
    for f in files:
        resolved = f.resolve()
        if resolved not in seen:
            seen.add(resolved)
            unique.append(resolved)
    return unique


def detect_format(path: Path, given: str | None = None) -> str:
    if given and given != "auto":
        if given not in FORMATS:
            raise JobError(f"--format must be one of auto, {', '.join(FORMATS)}, got {given!r}")
        return given
    fmt = _SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise JobError(f"cannot tell the format of {path.name}: pass --format")
    return fmt


def _line_value(record: Any, column: str | None) -> Any:
    if column is None:
        return None
    if not isinstance(record, dict):
        return Invalid("line is not a JSON object")
    if column not in record:
        return Invalid(f"no {column!r} field")
    return record[column]


def _jsonl_blocks(path: Path, cols: Columns, block_rows: int) -> Iterator[Block]:
    block = Block([], [] if cols.pair else None, [] if cols.id else None)
    with path.open("rb") as f:
        for line in f:
            if not line.strip():
                continue  # blank lines are not rows (a trailing newline, a separator)
            bad: Invalid | None = None
            record: Any = None
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                bad = Invalid(f"invalid JSON: {exc}")
            block.texts.append(bad or _line_value(record, cols.text))
            if block.pairs is not None:
                block.pairs.append(bad or _line_value(record, cols.pair))
            if block.ids is not None:
                value = None if bad else _line_value(record, cols.id)
                block.ids.append(None if isinstance(value, Invalid) else value)
            if len(block) >= block_rows:
                yield block
                block = Block([], [] if cols.pair else None, [] if cols.id else None)
    if len(block):
        yield block


def _text_blocks(path: Path, block_rows: int) -> Iterator[Block]:
    block = Block([], None, None)
    with path.open(encoding="utf-8", errors="strict", newline=None) as f:
        while True:
            try:
                line = f.readline()
            except UnicodeDecodeError as exc:
                raise JobError(f"{path.name} is not UTF-8 text: {exc}") from None
            if not line:
                break
            block.texts.append(line.rstrip("\n"))
            if len(block) >= block_rows:
                yield block
                block = Block([], None, None)
    if len(block):
        yield block


def _arrow_blocks(batches: Iterator[Any], cols: Columns) -> Iterator[Block]:
    for batch in batches:
        names = batch.schema.names

        def column(name: str | None, names: list[str] = names, batch: Any = batch) -> list[Any]:
            assert name is not None
            return batch.column(names.index(name)).to_pylist()

        yield Block(
            column(cols.text),
            column(cols.pair) if cols.pair else None,
            column(cols.id) if cols.id else None,
        )


def _wanted(cols: Columns) -> list[str]:
    return [c for c in (cols.text, cols.pair, cols.id) if c is not None]


def _check_columns(path: Path, names: Sequence[str], cols: Columns) -> None:
    missing = [c for c in _wanted(cols) if c not in names]
    if missing:
        raise JobError(
            f"{path.name} has no column {missing[0]!r} (columns: {', '.join(names)}); "
            "pass --text-column / --pair-column / --id-column"
        )


def iter_blocks(
    path: Path, fmt: str, cols: Columns, block_rows: int = 1024, start: int = 0
) -> Iterator[Block]:
    """The file's rows from row `start` on, in blocks of at most `block_rows`."""
    blocks: Iterator[Block]
    skip = start
    if fmt == "parquet":
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(path)
        _check_columns(path, pf.schema_arrow.names, cols)
        # Row groups wholly before `start` are not read at all.
        groups, first = [], 0
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if first + n > start:
                groups.append(g)
            else:
                skip -= n
            first += n
        blocks = _arrow_blocks(
            pf.iter_batches(batch_size=block_rows, columns=_wanted(cols), row_groups=groups), cols
        )
    elif fmt == "csv":
        import pyarrow as pa
        import pyarrow.csv as pcsv

        text_cols = {c: pa.string() for c in (cols.text, cols.pair) if c}
        try:
            reader = pcsv.open_csv(
                path,
                read_options=pcsv.ReadOptions(block_size=1 << 20),
                convert_options=pcsv.ConvertOptions(
                    include_columns=_wanted(cols), column_types=text_cols
                ),
            )
        except (pa.ArrowInvalid, KeyError) as exc:
            raise JobError(f"{path.name}: {exc}") from None
        blocks = _rebatch(_arrow_blocks(iter(reader), cols), block_rows)
    elif fmt == "jsonl":
        blocks = _jsonl_blocks(path, cols, block_rows)
    elif fmt == "text":
        if cols.pair or cols.id:
            raise JobError("plain-text input has one text per line: no pair or id column")
        blocks = _text_blocks(path, block_rows)
    else:
        raise JobError(f"unknown input format {fmt!r}")
    for block in blocks:
        if skip >= len(block):
            skip -= len(block)
            continue
        if skip:
            block = block.slice(skip, len(block))
            skip = 0
        yield block


def _rebatch(blocks: Iterator[Block], rows: int) -> Iterator[Block]:
    for block in blocks:
        for i in range(0, len(block), rows):
            yield block.slice(i, i + rows)


def count_rows(path: Path, fmt: str, cols: Columns) -> int:
    """Rows of a file as `iter_blocks` reads them (Parquet from its footer)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return int(pq.ParquetFile(path).metadata.num_rows)
    if fmt == "jsonl":
        with path.open("rb") as f:
            return sum(1 for line in f if line.strip())
    if fmt == "text":
        with path.open("rb") as f:
            return sum(1 for _ in f)
    return sum(len(b) for b in iter_blocks(path, fmt, Columns(cols.text), 1 << 16))


def file_identity(path: Path) -> dict[str, Any]:
    """What the manifest records of an input: a different file under the same name is refused."""
    stat = os.stat(path)
    return {"path": str(path), "bytes": stat.st_size}
