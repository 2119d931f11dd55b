#!/usr/bin/env bash
# Installs Infinity (infinity-emb) into its own virtual environment, bench/.venv-infinity, so that
# its pinned dependencies never touch the project's .venv. Idempotent: a finished install is kept.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-infinity"
version="${INFINITY_VERSION:-0.0.78}"
torch_version="${TORCH_VERSION:-2.13.0}"
python="${PYTHON:-python3}"
if [ -f "$venv/.installed-$version" ]; then
    exit 0
fi
test -x "$venv/bin/python" || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
# The CPU build of torch first, and held there: a bare requirement (Infinity's) would pull a
# multi-GB CUDA build. Where no local CPU wheel is configured (pip's find-links), TORCH_INDEX
# names PyTorch's CPU index.
"$venv/bin/python" -m pip install --quiet "torch==$torch_version" \
    ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"}
pins="$venv/torch-pin.txt"
echo "torch==$torch_version" > "$pins"
"$venv/bin/python" -m pip install --quiet -c "$pins" \
    "infinity-emb[server,torch,optimum]==$version"
touch "$venv/.installed-$version"
