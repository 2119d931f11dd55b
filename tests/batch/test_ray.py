"""The batch job and the Serve app on a real Ray cluster that the tests start on this machine:
a head node and a second node process (`ray start`), loopback only, stopped at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.batch.corpus import BAD, read_output, rows, write_parquet
from tests.helpers.process import free_port
from tests.helpers.ray_cluster import AUTH_ENV, LOOPBACK_ENV, USAGE_ENV, RayCluster
from vectorpress.engine import Engine
from vectorpress.jobs.inputs import Columns
from vectorpress.jobs.local import run_local
from vectorpress.jobs.spec import JobSpec
from vectorpress.settings import ModelSettings

pytestmark = pytest.mark.slow

N = 3000
SHARD = 250


@pytest.fixture(scope="module")
def cluster() -> Iterator[RayCluster]:
    """One CPU per node, so that two one-CPU actors must take one node each."""
    driver_env = {**LOOPBACK_ENV, **AUTH_ENV, **USAGE_ENV}
    saved = {k: os.environ.get(k) for k in driver_env}
    os.environ.update(driver_env)  # this process is a driver too
    with RayCluster(head_cpus=1, worker_cpus=1) as c:
        import ray

        try:
            yield c
        finally:
            ray.shutdown()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_parquet(tmp_path_factory.mktemp("ray-in") / "corpus.parquet", rows(N), 500)


def spec(inputs: Path, output: Path, **kw: Any) -> JobSpec:
    return JobSpec(
        inputs=(str(inputs),),
        output=str(output),
        columns=Columns("text", None, "id"),
        shard_rows=kw.pop("shard_rows", SHARD),
        **kw,
    )


def model(folder: Path) -> ModelSettings:
    return ModelSettings(str(folder), max_client_batch_size=256, max_batch_tokens=2048)


def test_ray_job_equals_the_local_job(
    cluster: RayCluster, corpus: Path, embedding_folder: Path, tmp_path: Path
) -> None:
    from vectorpress.jobs.ray_job import RayOptions, run_ray

    settings = model(embedding_folder)
    summary = run_ray(
        spec(corpus, tmp_path / "ray"),
        settings,
        RayOptions(cluster.address, actors=2, cpus_per_actor=1),
        progress="none",
    )
    assert summary.shards == N // SHARD and summary.rows == N - len(BAD)
    with Engine(settings=settings, threads=1) as engine:
        run_local(spec(corpus, tmp_path / "local"), engine, progress="none")
    ray_table, local_table = read_output(tmp_path / "ray"), read_output(tmp_path / "local")
    for column in ("row", "id", "tokens"):
        assert ray_table[column].to_pylist() == local_table[column].to_pylist(), column
    np.testing.assert_allclose(
        np.asarray(ray_table["embedding"].to_pylist(), dtype=np.float32),
        np.asarray(local_table["embedding"].to_pylist(), dtype=np.float32),
        atol=1e-6,
    )
    ray_manifest = json.loads((tmp_path / "ray/manifest.json").read_text())
    local_manifest = json.loads((tmp_path / "local/manifest.json").read_text())
    for key in ("format", "model", "options", "inputs", "rows", "rejects", "tokens", "complete"):
        assert ray_manifest[key] == local_manifest[key], key
    rejects = sorted((tmp_path / "ray/rejects").glob("*.jsonl"))
    assert [json.loads(x)["row"] for p in rejects for x in p.read_text().splitlines()] == sorted(
        BAD
    )
    # the shards ran on actors on both nodes
    nodes = {s["worker"].split(":")[0] for s in ray_manifest["shards"]}
    assert len(nodes) == 2, ray_manifest["shards"]

    # The command line on the same folder: nothing left to do; other options are refused.
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2] / "src"))
    args = [sys.executable, "-m", "vectorpress", "embed", str(corpus), "-o", str(tmp_path / "ray"),
            "--id-column", "id", "--shard-rows", str(SHARD), "--model-id", str(embedding_folder),
            "--max-batch-tokens", "2048", "--ray-address", cluster.address]  # fmt: skip
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"0 shards written, {N // SHARD} already done" in done.stderr
    refused = subprocess.run(
        [*args, "--encoding", "binary"], env=env, capture_output=True, text=True, timeout=300
    )
    assert refused.returncode == 1 and "other options" in refused.stderr


def test_killed_actor_is_retried_and_every_row_is_written_once(
    cluster: RayCluster, corpus: Path, embedding_folder: Path, tmp_path: Path
) -> None:
    from vectorpress.jobs.ray_job import RayOptions, run_ray

    out = tmp_path / "out"
    job = spec(corpus, out, shard_rows=100)
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["summary"] = run_ray(
                job, model(embedding_folder), RayOptions(cluster.address, actors=2), "none"
            )
        except BaseException as exc:  # handed to the test below
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 240
    while len(list((out / "_shards").glob("*.json"))) < 3:
        assert thread.is_alive(), result
        assert time.monotonic() < deadline, "no shard finished"
        time.sleep(0.1)
    actors = [
        p for p in cluster.processes() if "ShardWorker" in " ".join(p.cmdline() or [p.name()])
    ]
    assert actors, [p.name() for p in cluster.processes()]
    victim = actors[0].pid
    os.kill(victim, signal.SIGKILL)
    thread.join(600)
    assert "error" not in result, result.get("error")
    table = read_output(out)
    good = [i for i in range(N) if i not in BAD]
    assert table["row"].to_pylist() == good  # every row, exactly once, in order
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] and manifest["rows"] == len(good)
    assert len(manifest["shards"]) == N // 100
    assert not any(p.pid == victim for p in cluster.processes())


def test_serve_app_answers_the_openai_sdk_and_tei_client(
    cluster: RayCluster, embedding_folder: Path, cross_encoder_folder: Any
) -> None:
    import openai
    import ray
    from ray import serve
    from tei_client import HttpClient

    import vectorpress.ray

    ray.init(address=cluster.address, ignore_reinit_error=True, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        serve.run(
            vectorpress.ray.app(
                str(embedding_folder), threads=1, num_replicas=1,
                ray_actor_options={"num_cpus": 0.5},
            ),
            name="embedder", route_prefix="/",
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        texts = ["A man is eating food.", "A man is eating a piece of bread."]
        with Engine(str(embedding_folder), threads=1) as engine:
            expected = engine.embed(texts)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        got = client.embeddings.create(model="m", input=texts, encoding_format="float")
        np.testing.assert_allclose([d.embedding for d in got.data], expected, atol=1e-6)
        tei = HttpClient(url, timeout=60)
        assert tei.health()
        assert tei.info().max_client_batch_size == 32
        np.testing.assert_allclose(tei.embed(texts), expected, atol=1e-6)
        # TEI's errors come through the proxy unchanged
        bad = httpx.post(f"{url}/embed", json={"inputs": []}, timeout=30)
        assert bad.status_code == 400 and bad.json()["error_type"] == "Empty"
        metrics = httpx.get(f"{url}/metrics", timeout=30)
        assert "te_request_count" in metrics.text
    finally:
        serve.shutdown()
