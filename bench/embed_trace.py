"""`vectorpress serve` with each backend pass timed twice: its wall time and the CPU time of the
thread that ran it. Used by bench/gpu_serve.py --trace, to tell a device thread that computes
from one that waits (for the interpreter lock, for a core, for the GPU) while it holds a batch.

    VP_EMBED_TRACE=FILE [VP_EMBED_SAMPLE=FILE2] python bench/embed_trace.py serve ARGS...

Appends one line per pass to FILE: `texts wall_s cpu_s`. On a GPU, CUDA's default synchronizing
spins, so a wait for the GPU counts as CPU time too: wall minus CPU is the time the thread was
not running at all.

With VP_EMBED_SAMPLE, a sampler thread also looks at the device thread every millisecond: which
lines it is on (its innermost frames), and whether its CPU clock advanced since the last look
(running) or not (waiting: for the interpreter lock, a core, a lock). It also reads every OS
thread's CPU time (/proc/self/task), so that the report says who else kept the cores and the
interpreter busy. FILE2 is rewritten as JSON every SAMPLE_DUMP seconds with the totals so far;
`sample_delta` turns two such snapshots into the figures of what ran between them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

#: Seconds between two looks at the device thread, and between two snapshots written.
SAMPLE_EVERY = 0.001
SAMPLE_DUMP = 0.25
#: The device thread's name (`core.worker.ModelThread`) and how many of its frames make a key.
DEVICE_THREAD = "vp-backend"
STACK_DEPTH = 5


def traced(fn: Callable[..., Any], log: TextIO, lock: threading.Lock) -> Callable[..., Any]:
    def run(self: Any, batch: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        out = fn(self, batch)
        line = f"{batch.size} {time.perf_counter() - wall:.6f} {time.thread_time() - cpu:.6f}\n"
        with lock:
            log.write(line)  # line-buffered: the benchmark reads the file while the server runs
        return out

    return run


def _tasks() -> dict[int, tuple[str, float]]:
    """Every OS thread of this process: tid -> (its name, CPU seconds so far)."""
    out: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def _key(frame: Any) -> str:
    parts = []
    while frame is not None and len(parts) < STACK_DEPTH:
        code = frame.f_code
        parts.append(f"{Path(code.co_filename).name}:{frame.f_lineno} {code.co_name}")
        frame = frame.f_back
    return " < ".join(parts)


def _started_device(thread: threading.Thread) -> bool:
    return thread.name == DEVICE_THREAD and thread.ident is not None


def sample(path: Path, stop: threading.Event) -> None:
    """The sampler thread's loop (see the module's doc)."""
    # A thread still starting is listed without its ident: wait until it has one.
    while not (device := next((t for t in threading.enumerate() if _started_device(t)), None)):
        if stop.wait(0.05):
            return
    assert device.ident is not None
    clock = time.pthread_getcpuclockid(device.ident)
    stacks: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    first = _tasks()
    started = last = time.perf_counter()
    last_cpu = time.clock_gettime(clock)
    dumped = started
    while not stop.wait(SAMPLE_EVERY):
        frame = sys._current_frames().get(device.ident)
        try:
            now, cpu = time.perf_counter(), time.clock_gettime(clock)
        except OSError:  # the device thread has ended: the server is stopping
            return
        row = stacks[_key(frame)]
        row[0] += 1
        row[1] += now - last
        row[2] += cpu - last_cpu
        last, last_cpu = now, cpu
        if now - dumped >= SAMPLE_DUMP:
            dumped = now
            names = {t.native_id: t.name for t in threading.enumerate()}
            threads = {
                f"{names.get(tid, name)}/{tid}": cpu_s - first.get(tid, (name, 0.0))[1]
                for tid, (name, cpu_s) in _tasks().items()
            }
            snapshot = {"wall_s": now - started, "threads": threads, "stacks": stacks}
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(snapshot))
            tmp.replace(path)


def sample_delta(before: dict[str, Any], after: dict[str, Any], top: int = 8) -> dict[str, Any]:
    """What ran between two snapshots: the wall seconds, each thread's CPU seconds (busiest
    first), and the device thread's `top` stacks by wall time as (stack, wall s, CPU s)."""
    wall = after["wall_s"] - before.get("wall_s", 0.0)
    threads = {
        name: cpu - before.get("threads", {}).get(name, 0.0)
        for name, cpu in after["threads"].items()
    }
    old = before.get("stacks", {})
    stacks = []
    for key, (_, w, c) in after["stacks"].items():
        _, w0, c0 = old.get(key, (0, 0.0, 0.0))
        if w - w0 > 0:
            stacks.append((key, w - w0, c - c0))
    stacks.sort(key=lambda s: -s[1])
    busy = sorted(((n, c) for n, c in threads.items() if c > 0), key=lambda t: -t[1])
    return {"wall_s": wall, "threads": busy, "stacks": stacks[:top]}


def main() -> None:
    from vectorpress.backends.torch.backend import TorchBackend
    from vectorpress.cli import main as serve

    log = open(os.environ["VP_EMBED_TRACE"], "a", buffering=1)  # noqa: SIM115 (the server's life)
    lock = threading.Lock()
    TorchBackend.embed = traced(TorchBackend.embed, log, lock)  # type: ignore[method-assign]
    TorchBackend.predict = traced(TorchBackend.predict, log, lock)  # type: ignore[method-assign]
    if out := os.environ.get("VP_EMBED_SAMPLE"):
        stop = threading.Event()
        threading.Thread(
            target=sample, args=(Path(out), stop), name="vp-sampler", daemon=True
        ).start()
    sys.argv[0] = "vectorpress"
    sys.exit(serve())


if __name__ == "__main__":
    main()
