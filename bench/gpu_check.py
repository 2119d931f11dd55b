"""GPU parity and throughput, in-process: vectorpress's torch backend against
sentence-transformers on the same GPU and the same corpus. Run by bench/gpu.sh."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.corpus import SHORT_QUERY, corpus  # noqa: E402
from bench.tokens import bench_tokenizer, packaged_model  # noqa: E402

from vectorpress.backends.torch.backend import TorchBackend  # noqa: E402
from vectorpress.model_spec import load_model_spec  # noqa: E402
from vectorpress.settings import ModelSettings  # noqa: E402
from vectorpress.types import Batch, Encoding  # noqa: E402


def main() -> None:
    from sentence_transformers import SentenceTransformer

    # VP_DEVICE=cpu runs the same script on a CPU, to check the script itself.
    device = os.environ.get("VP_DEVICE", "cuda")
    assert device == "cpu" or torch.cuda.is_available(), "no CUDA device"

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    model = packaged_model()
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4000
    texts = corpus(n)
    tok = bench_tokenizer(model)  # truncated at 256, MiniLM's max_seq_length
    encs = [Encoding(ids=e.ids, type_ids=e.type_ids) for e in tok.encode_batch(texts)]
    tokens = sum(len(e) for e in encs)
    spec = load_model_spec(model, ModelSettings(str(model)))
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"{name}: {n} texts, {tokens} tokens; model {model}")

    def batches(budget: int) -> list[Batch]:
        out, cur, used = [], [], 0
        for e in encs:
            if cur and used + len(e) > budget:
                out.append(Batch.from_encodings(cur))
                cur, used = [], 0
            cur.append(e)
            used += len(e)
        return [*out, Batch.from_encodings(cur)]

    rows = []
    sample = texts[:256]
    for dtype, st_dtype, min_cos in (
        ("float32", torch.float32, 0.99999),
        ("float16", torch.float16, 0.999),
        ("bfloat16", torch.bfloat16, 0.995),
    ):
        st = SentenceTransformer(str(model), device=device).to(st_dtype)
        backend = TorchBackend(spec, device, dtype)
        ref = st.encode(sample, batch_size=32, normalize_embeddings=True)
        pooled = backend.embed(Batch.from_encodings(encs[:256])).pooled
        assert pooled is not None
        got = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
        cos = float((got * ref).sum(1).min())
        st.encode(texts[:512], batch_size=32)
        sync()
        t = time.perf_counter()
        st.encode(texts, batch_size=32)
        sync()
        st_tps = tokens / (time.perf_counter() - t)
        plan = batches(16384)
        for b in plan[:3]:
            backend.embed(b)
        sync()
        t = time.perf_counter()
        for b in plan:
            backend.embed(b)
        sync()
        vp_tps = tokens / (time.perf_counter() - t)
        q = tok.encode(SHORT_QUERY)
        one = Batch.from_encodings([Encoding(ids=q.ids, type_ids=q.type_ids)])
        lat = []
        for _ in range(50):
            t = time.perf_counter()
            backend.embed(one)
            lat.append(time.perf_counter() - t)
        rows.append((dtype, cos, min_cos, st_tps, vp_tps, sorted(lat[10:])[20] * 1e3))
    print("| dtype | min cosine to ST (bound) | ST encode tok/s | vectorpress tok/s | ratio | "
          "short query p50 ms |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    ok = True
    for dtype, cos, bound, st_tps, vp_tps, p50 in rows:
        ok &= cos >= bound
        print(f"| {dtype} | {cos:.6f} ({bound}) | {st_tps:,.0f} | {vp_tps:,.0f} | "
              f"{vp_tps / st_tps:.2f} | {p50:.2f} |")  # fmt: skip
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
