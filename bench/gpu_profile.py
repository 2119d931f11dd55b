"""Where a GPU pass's time goes, by batch size: wall time per pass against the GPU's kernel time
and the kernels launched, and the host-side operators that take the most of it. Run by hand on a
GPU machine (bench/gpu.sh's set-up first: the model package on PYTHONPATH):

    python bench/gpu_profile.py [--dtype float16]

A pass whose wall time far exceeds its kernel time is bound by the host (Python and kernel
launches), which a larger batch amortizes and a captured graph would remove.
VP_DEVICE=cpu runs the same script on a CPU, to check the script itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.corpus import corpus  # noqa: E402
from bench.tokens import bench_tokenizer, packaged_model  # noqa: E402

from vectorpress.backends.torch.backend import TorchBackend  # noqa: E402
from vectorpress.model_spec import load_model_spec  # noqa: E402
from vectorpress.settings import ModelSettings  # noqa: E402
from vectorpress.types import Batch, Encoding  # noqa: E402

SIZES = (1, 4, 16, 64, 256)


def main() -> None:

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", help="default: float16 on a GPU, float32 on a CPU")
    args = ap.parse_args()
    device = os.environ.get("VP_DEVICE", "cuda")
    args.dtype = args.dtype or ("float32" if device == "cpu" else "float16")
    model = packaged_model()
    spec = load_model_spec(model, ModelSettings(str(model)))
    tok = bench_tokenizer(model)  # truncated at 256, MiniLM's max_seq_length
    texts = corpus(max(SIZES))
    encs = [Encoding(ids=e.ids, type_ids=e.type_ids) for e in tok.encode_batch(texts)]

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    print(f"{device} {args.dtype}: torch {torch.__version__}")
    print(
        "| CUDA graphs | texts | tokens | wall ms/pass | kernel ms/pass | kernels/pass "
        "| top host ops (ms/pass) |"
    )
    print("|---|---|---|---|---|---|---|")
    # Eager first: the graphs' numbers then come from the same warm device.
    backends = [TorchBackend(spec, device, args.dtype, cuda_graphs=g) for g in (False, True)]
    for backend, n in ((b, n) for b in backends for n in SIZES):
        batch = Batch.from_encodings(encs[:n])
        for _ in range(5):
            backend.embed(batch)
        sync()
        walls = []
        for _ in range(30):
            t = time.perf_counter()
            backend.embed(batch)
            sync()
            walls.append(time.perf_counter() - t)
        reps = 10
        activities = [ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(ProfilerActivity.CUDA)
        with profile(activities=activities) as prof:
            for _ in range(reps):
                backend.embed(batch)
            sync()
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        kernel_ms = sum(e.device_time for e in kernels) / 1e3 / reps
        host = sorted(prof.key_averages(), key=lambda a: -a.self_cpu_time_total)[:4]
        tops = ", ".join(f"{a.key} {a.self_cpu_time_total / 1e3 / reps:.2f}" for a in host)
        print(
            f"| {'on' if backend.graphs else 'off'} | {n} | {batch.total_tokens} "
            f"| {statistics.median(walls) * 1e3:.2f} "
            f"| {kernel_ms:.2f} | {len(kernels) / reps:.0f} | {tops} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
