"""A seeded benchmark corpus of real English prose that needs no network.

The prose is the docstrings of a fixed list of standard-library modules, split into sentences.
Texts are 40% short queries (3-12 words), 40% medium passages (2-6 sentences) and 20% long
passages (15-40 sentences, truncated by the model at its max length), in a fixed interleaving
so that any prefix of the corpus has the same mix.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import random
import re
import subprocess
import sys

MODULES = (
    "argparse", "asyncio", "collections", "csv", "datetime", "decimal", "email", "functools",
    "http.client", "json", "logging", "pathlib", "random", "re", "socket", "sqlite3",
    "statistics", "subprocess", "textwrap", "threading", "unittest", "urllib.request",
    "zipfile", "tarfile", "heapq", "bisect", "itertools", "os", "shutil", "string", "typing",
    "inspect", "pickle", "io", "contextlib", "dataclasses", "enum", "fractions", "ipaddress",
    "mailbox", "smtplib", "ssl", "struct", "tempfile", "time", "uuid", "xml.dom.minidom",
)  # fmt: skip


def sentences(modules: tuple[str, ...] = MODULES) -> list[str]:
    """Every sentence of the modules' docstrings, in a fixed order, as the standard library
    writes them: read in a fresh interpreter, because a library imported here may have replaced
    one of its functions (Ray swaps `inspect.isgenerator` for one without a docstring, which
    moved every corpus text after that sentence in any test process that had imported Ray)."""
    return list(_fresh(modules))


@functools.cache
def _fresh(modules: tuple[str, ...]) -> tuple[str, ...]:
    # -I -S: no site, so no .pth file imports anything before the modules are read.
    done = subprocess.run(
        [sys.executable, "-I", "-S", __file__, *modules], capture_output=True, text=True, check=True
    )
    return tuple(json.loads(done.stdout))


def _read(modules: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        docs = [inspect.getdoc(module) or ""]
        for attr in sorted(dir(module)):
            if attr.startswith("_"):
                continue
            obj = getattr(module, attr, None)
            if obj is None or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            doc = inspect.getdoc(obj)
            if doc:
                docs.append(doc)
        for doc in docs:
            flat = re.sub(r"\s+", " ", doc)
            for sentence in re.split(r"(?<=[.!?])\s+", flat):
                if 20 <= len(sentence) <= 400 and sentence[0].isalpha():
                    out.append(sentence)
    return out


def kind(i: int) -> str:
    """Which part of the mix text i of any corpus is: "short", "medium" or "long"."""
    r = (i * 0.618034) % 1.0
    return "short" if r < 0.4 else "medium" if r < 0.8 else "long"


def corpus(n: int, seed: int = 0) -> list[str]:
    """n texts: 40% short queries, 40% medium passages, 20% long passages."""
    pool = sentences()
    rng = random.Random(seed)
    out = []
    for i in range(n):
        part = kind(i)
        if part == "short":
            words = rng.choice(pool).split()[: rng.randint(3, 12)]
            out.append(" ".join(words).rstrip(".,;:"))
        elif part == "medium":
            out.append(" ".join(rng.choice(pool) for _ in range(rng.randint(2, 6))))
        else:
            out.append(" ".join(rng.choice(pool) for _ in range(rng.randint(15, 40))))
    return out


SHORT_QUERY = "How do I read a CSV file into a list of rows?"
"""The one short query of the latency measurement (about a dozen tokens)."""


if __name__ == "__main__":
    print(json.dumps(_read(tuple(sys.argv[1:]))))
