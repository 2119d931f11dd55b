"""`vectorpress serve` with each backend pass timed twice: its wall time and the CPU time of the
thread that ran it. Used by bench/gpu_serve.py --trace, to tell a device thread that computes
from one that waits (for the interpreter lock, for a core, for the GPU) while it holds a batch.

    VP_EMBED_TRACE=FILE python bench/embed_trace.py serve ARGS...

Appends one line per pass to FILE: `texts wall_s cpu_s`. On a GPU, CUDA's default synchronizing
spins, so a wait for the GPU counts as CPU time too: wall minus CPU is the time the thread was
not running at all.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO


def traced(fn: Callable[..., Any], log: TextIO, lock: threading.Lock) -> Callable[..., Any]:
    def run(self: Any, batch: Any) -> Any:
        wall, cpu = time.perf_counter(), time.thread_time()
        out = fn(self, batch)
        line = f"{batch.size} {time.perf_counter() - wall:.6f} {time.thread_time() - cpu:.6f}\n"
        with lock:
            log.write(line)  # line-buffered: the benchmark reads the file while the server runs
        return out

    return run


def main() -> None:
    from vectorpress.backends.torch.backend import TorchBackend
    from vectorpress.cli import main as serve

    log = open(os.environ["VP_EMBED_TRACE"], "a", buffering=1)  # noqa: SIM115 (the server's life)
    lock = threading.Lock()
    TorchBackend.embed = traced(TorchBackend.embed, log, lock)  # type: ignore[method-assign]
    TorchBackend.predict = traced(TorchBackend.predict, log, lock)  # type: ignore[method-assign]
    sys.argv[0] = "vectorpress"
    sys.exit(serve())


if __name__ == "__main__":
    main()
