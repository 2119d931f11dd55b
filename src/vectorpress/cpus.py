"""How many CPUs this process may use: the thread count every default is sized by.

`os.cpu_count()` is the host's core count. In a container limited to two CPUs on a 64-core
host, 64 torch threads and 63 tokenizer threads contend for two CPUs' worth of time, and the
scheduler's throttling stalls them all at once. What the process may really use is the smaller
of its affinity mask (taskset, cpusets) and its cgroup CPU quota (docker --cpus, Kubernetes
limits), rounded up to whole CPUs. Also the CPU's feature flags, for the backends that need a
native kernel (bf16) and must refuse a CPU without one.
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

CGROUP_ROOT = Path("/sys/fs/cgroup")
SELF_CGROUP = Path("/proc/self/cgroup")


def available_cpus() -> int:
    """CPUs this process may use: affinity, capped by the cgroup CPU quota; at least 1."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, self_cgroup: Path = SELF_CGROUP) -> float | None:
    """CPUs' worth of time the cgroup quota allows (2.5 for `--cpus 2.5`), None without a limit.

    cgroup v2 writes `cpu.max` as "QUOTA PERIOD" ("max PERIOD" for none); v1 writes
    `cpu.cfs_quota_us` (-1 for none) beside `cpu.cfs_period_us`. A parent's limit binds its
    children, so every level from the process's cgroup up to the root counts. Unreadable files
    mean no limit that can be known, never an error.
    """
    try:
        lines = self_cgroup.read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":
            limits += _levels(root, path, _v2_limit)
        elif "cpu" in controllers.split(","):
            for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                if mount.is_dir():
                    limits += _levels(mount, path, _v1_limit)
                    break
    return min(limits) if limits else None


def _levels(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """The limits found from the cgroup's own folder up to the mount.

    Inside a container the mount's root is the container's own cgroup while /proc/self/cgroup
    may still name the host's path: a path that does not exist under the mount is read as the
    mount root alone.
    """
    folder = mount / path.lstrip("/")
    if not folder.is_dir():
        folder = mount
    found = []
    while True:
        limit = read(folder)
        if limit is not None:
            found.append(limit)
        if folder == mount or mount not in folder.parents:
            return found
        folder = folder.parent


def _v2_limit(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return _ratio(quota, period)


def _v1_limit(folder: Path) -> float | None:
    try:
        quota = (folder / "cpu.cfs_quota_us").read_text().strip()
        period = (folder / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    if q <= 0 or p <= 0:  # -1: no quota
        return None
    return q / p


def first_cpu(cpuinfo: str) -> dict[str, str]:
    """The first CPU's fields ("model name", "flags", ...) of a /proc/cpuinfo text."""
    first = cpuinfo.split("\n\n", 1)[0]
    return {k.strip(): v.strip() for k, _, v in (x.partition(":") for x in first.splitlines())}


@functools.cache
def cpu_info() -> Mapping[str, str]:
    """This machine's `first_cpu` fields; empty where /proc/cpuinfo is unreadable. Read-only:
    every caller shares the one cached value."""
    try:
        return MappingProxyType(first_cpu(Path("/proc/cpuinfo").read_text()))
    except OSError:
        return MappingProxyType({})


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags as Linux names them (empty where /proc/cpuinfo is unreadable)."""
    return frozenset(cpu_info().get("flags", "").split())


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX512-BF16 or AMX)."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def native_int8_dot() -> bool:
    """Whether this CPU has int8 dot-product instructions (VNNI in AVX-512 or AVX, or AMX)."""
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & cpu_flags())


PROC_STAT = Path("/proc/stat")
SELF_STAT = Path("/proc/self/stat")


@dataclass(frozen=True)
class CpuSample:
    """Busy time of this process's CPUs (every process's) and of this process, at one moment."""

    when: float
    cpus: int
    busy: int
    """Clock ticks the CPUs in this process's affinity mask spent on any process's work."""
    own: int
    """Clock ticks this process's threads have run."""

    @classmethod
    def now(cls, proc_stat: Path = PROC_STAT, self_stat: Path = SELF_STAT) -> CpuSample | None:
        """A sample, or None where /proc cannot tell (not Linux)."""
        try:
            mine = os.sched_getaffinity(0)
            busy = 0
            for line in proc_stat.read_text().splitlines():
                name, *fields = line.split()
                if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in mine:
                    # user, nice, system, idle, iowait, irq, softirq: steal is the
                    # hypervisor's, which no wait here gives back.
                    user, nice, system, _, _, irq, softirq = (int(f) for f in fields[:7])
                    busy += user + nice + system + irq + softirq
            stat = self_stat.read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            own = int(fields[11]) + int(fields[12])  # utime, stime
        except (AttributeError, OSError, ValueError, IndexError):
            return None
        return cls(time.monotonic(), len(mine), busy, own)

    def others_since(self, before: CpuSample) -> float:
        """The share of this process's CPUs' time that other processes took since `before`."""
        ticks = (self.when - before.when) * os.sysconf("SC_CLK_TCK") * self.cpus
        others = (self.busy - before.busy) - (self.own - before.own)
        return max(0.0, others / ticks) if ticks > 0 else 0.0
