"""Thread defaults follow the CPUs the process may use: affinity and the cgroup CPU quota; and
how busy other processes keep those CPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.helpers.process import free_port
from vectorpress.cpus import CpuSample, available_cpus, cgroup_cpu_limit, first_cpu


def _tree(tmp_path: Path, self_cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "sys-fs-cgroup"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    root.mkdir(exist_ok=True)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(self_cgroup)
    return root, proc


def test_v2_quota_of_the_cgroup_and_its_parents(tmp_path: Path) -> None:
    root, proc = _tree(
        tmp_path,
        "0::/kubepods/pod1/ctr\n",
        {
            "cpu.max": "max 100000\n",
            "kubepods/pod1/cpu.max": "150000 100000\n",
            "kubepods/pod1/ctr/cpu.max": "max 100000\n",
        },
    )
    assert cgroup_cpu_limit(root, proc) == 1.5
    (root / "kubepods/pod1/ctr/cpu.max").write_text("50000 100000\n")
    assert cgroup_cpu_limit(root, proc) == 0.5


def test_v2_without_a_quota(tmp_path: Path) -> None:
    root, proc = _tree(tmp_path, "0::/user.slice\n", {"cpu.max": "max 100000\n"})
    assert cgroup_cpu_limit(root, proc) is None


def test_v2_inside_a_container_reads_the_mount_root(tmp_path: Path) -> None:
    # The container's namespace shows its own cgroup as the mount root, while
    # /proc/self/cgroup can still name a host path that does not exist in it.
    root, proc = _tree(
        tmp_path, "0::/system.slice/docker-abc.scope\n", {"cpu.max": "200000 100000"}
    )
    assert cgroup_cpu_limit(root, proc) == 2.0


def test_v1_cfs_quota(tmp_path: Path) -> None:
    root, proc = _tree(
        tmp_path,
        "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n",
        {
            "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000\n",
            "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
            "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        },
    )
    assert cgroup_cpu_limit(root, proc) == 2.5
    (root / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_cpu_limit(root, proc) is None


def test_unreadable_or_odd_files_mean_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_limit(tmp_path / "none", tmp_path / "none") is None
    root, proc = _tree(tmp_path, "0::/\n", {"cpu.max": "garbage"})
    assert cgroup_cpu_limit(root, proc) is None


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux affinity")
def test_a_server_started_on_one_cpu_sizes_its_threads_by_it(
    tiny_bert_family: Callable[..., Path], tmp_path: Path
) -> None:
    if available_cpus() < 2:
        pytest.skip("needs two CPUs to tell one from the host's count")
    one = min(os.sched_getaffinity(0))
    port = free_port()
    log = tmp_path / "stdout"
    cmd = [sys.executable, "-m", "vectorpress", "serve", "--model-id"]
    cmd += [str(tiny_bert_family()), "--hostname", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "LOG_LEVEL": "info"}
    env.pop("TOKENIZATION_WORKERS", None)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*cmd, "--json-output"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=lambda: os.sched_setaffinity(0, {one}),
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                info = httpx.get(f"http://127.0.0.1:{port}/info", timeout=30).json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not open its port"
                time.sleep(0.2)
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
        [loaded] = [x["fields"] for x in lines if x.get("message") == "model loaded and warmed up"]
        assert loaded["threads"] == 1, loaded
        assert loaded["tokenization_workers"] == info["tokenization_workers"] == 1
    finally:
        proc.terminate()
        proc.wait(60)


def test_the_cpu_fields_are_the_first_cpus() -> None:
    # Two CPUs as Linux lists them: a blank line between, tabs before each colon.
    text = (
        "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n"
        "model name\t: AMD EPYC\nflags\t\t: fpu avx2 fma\n\n"
        "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu avx512f\n\n"
    )
    fields = first_cpu(text)
    assert fields["model name"] == "AMD EPYC" and fields["cpu family"] == "25"
    assert fields["model"] == "1" and fields["flags"].split() == ["fpu", "avx2", "fma"]
    assert first_cpu("") == {}


def test_other_processes_busy_time_is_read_on_this_process_cpus_only(tmp_path: Path) -> None:
    mine = sorted(os.sched_getaffinity(0))
    other = max(mine) + 1
    stat = tmp_path / "stat"
    own = tmp_path / "self-stat"
    lines = ["cpu  1 1 1 1 1 1 1 0 0 0"]
    # user nice system idle iowait irq softirq steal: all but idle, iowait and steal are busy.
    lines += [f"cpu{c} 100 1 10 5000 7 2 3 999 0 0" for c in mine]
    lines += [f"cpu{other} 100000 0 0 0 0 0 0 0 0 0", "intr 12345", "ctxt 99"]
    stat.write_text("\n".join(lines) + "\n")
    # The command name may hold spaces and parentheses; utime and stime are fields 14 and 15.
    own.write_text("42 (a (b) c) R " + " ".join(["0"] * 10) + " 30 12 " + " ".join(["0"] * 30))
    sample = CpuSample.now(stat, own)
    assert sample is not None
    assert (sample.cpus, sample.busy, sample.own) == (len(mine), 116 * len(mine), 42)
    hz = os.sysconf("SC_CLK_TCK")
    later = CpuSample(sample.when + 2.0, sample.cpus, sample.busy + hz * sample.cpus, 42 + hz // 2)
    # Over 2 s, the CPUs were busy for one CPU-second each, this process half a second of it.
    share = (hz * sample.cpus - hz // 2) / (2.0 * hz * sample.cpus)
    assert later.others_since(sample) == pytest.approx(share)
    assert CpuSample.now(tmp_path / "missing", own) is None


def test_a_process_spinning_on_one_of_the_cpus_shows_as_others_load() -> None:
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        before = CpuSample.now()
        time.sleep(1.0)
        after = CpuSample.now()
    finally:
        spinner.kill()
        spinner.wait()
    assert before is not None and after is not None
    # One of the process's CPUs' worth, nearly all of it (this process slept meanwhile).
    assert after.others_since(before) >= 0.7 / before.cpus
