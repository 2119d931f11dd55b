"""What Linux says about a test process's own pages."""

from __future__ import annotations

import re
from pathlib import Path

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def thp_given() -> bool:
    """Whether Linux gives transparent huge pages to memory that asks for them here."""
    return THP.exists() and "[never]" not in THP.read_text()


def huge_kib(address: int) -> int:
    """AnonHugePages of the mapping that holds `address` (kB), from /proc/self/smaps."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        bounds = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if bounds and int(bounds[1], 16) <= address < int(bounds[2], 16):
            for field in lines[i + 1 :]:
                if field.startswith("AnonHugePages:"):
                    return int(field.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")
