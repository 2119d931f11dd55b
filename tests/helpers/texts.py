"""Real English prose available offline: docstrings of the standard library, chopped to lengths."""

from __future__ import annotations

import random

from bench.corpus import sentences as corpus_sentences

_MODULES = (
    "argparse",
    "asyncio",
    "collections",
    "csv",
    "datetime",
    "decimal",
    "email",
    "functools",
    "http.client",
    "json",
    "logging",
    "pathlib",
    "random",
    "re",
    "socket",
    "sqlite3",
    "statistics",
    "subprocess",
    "textwrap",
    "threading",
    "unittest",
    "urllib.request",
    "zipfile",
    "tarfile",
    "heapq",
    "bisect",
)


def sentences() -> list[str]:
    """Every sentence of the docstrings of a fixed set of stdlib modules, in a fixed order (read
    in a fresh interpreter: `bench.corpus.sentences`)."""
    return corpus_sentences(_MODULES)


def mixed_texts(n: int, seed: int = 0, long_share: float = 0.2) -> list[str]:
    """n texts: 40% short queries, 40% medium passages, the rest long passages."""
    pool = sentences()
    rng = random.Random(seed)
    out = []
    for i in range(n):
        r = (i * 0.618034) % 1.0
        if r < 0.4:
            words = rng.choice(pool).split()[: rng.randint(3, 12)]
            out.append(" ".join(words))
        elif r < 1.0 - long_share:
            out.append(" ".join(rng.choice(pool) for _ in range(rng.randint(2, 6))))
        else:
            out.append(" ".join(rng.choice(pool) for _ in range(rng.randint(15, 40))))
    return out
