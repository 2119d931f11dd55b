"""The portable CPU path (F.linear everywhere, no int8: what a CPU without oneDNN, AVX-512 or
fbgemm runs) keeps parity with the references, forced on a machine that has every fast kernel.

VECTORPRESS_PORTABLE_CPU=1 takes vectorpress's oneDNN and fbgemm paths away and torch's
ATEN_CPU_CAPABILITY=default its AVX2/AVX-512 kernels; both are read at start-up, so the parity
tests run in a process of their own. The tests of a fast path skip there, saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORCED = {"VECTORPRESS_PORTABLE_CPU": "1", "ATEN_CPU_CAPABILITY": "default"}
# Parity against transformers / sentence-transformers for every native architecture and task,
# and the packed CPU passes against one pass.
PARITY = (
    "tests/models/test_bert_family.py",
    "tests/models/test_zoo.py",
    "tests/fast_paths/test_fast_linear.py",
)
PROBE = """
import torch
from vectorpress.backends.torch.int8 import int8_ready
from vectorpress.backends.torch.layers import onednn_supported
from vectorpress.errors import StartupError
try:
    int8_ready()
    int8 = "int8 ready"
except StartupError:
    int8 = "no int8"
fp32 = "oneDNN" if onednn_supported(torch.float32) else "F.linear"
print(fp32, int8, torch.backends.cpu.get_cpu_capability())
"""


def _env() -> dict[str, str]:
    return {**os.environ, **FORCED}


def test_the_switch_takes_every_fast_kernel_away() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], env=_env(), capture_output=True, text=True, timeout=120
    )
    assert probe.stdout.split() == ["F.linear", "no", "int8", "DEFAULT"], probe.stderr[-2000:]


@pytest.mark.slow
def test_parity_holds_on_the_portable_path() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *PARITY],
        env=_env(),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    tail = run.stdout[-4000:]
    assert run.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail, tail
    # The oneDNN tests skip with their reason rather than pass without testing anything.
    assert "no oneDNN packed linear" in tail, tail
