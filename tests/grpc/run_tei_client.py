"""Runs the `tei-client` PyPI package's gRPC client, unmodified, in its own process.

Reads {"embed": target, "rerank": target, "classify": target, "texts": [...], "query": str}
as JSON on stdin and prints what the client returned as JSON.
"""

from __future__ import annotations

import json
import sys

from tei_client import GrpcClient


def main() -> None:
    job = json.load(sys.stdin)
    texts, query = job["texts"], job["query"]
    out: dict[str, object] = {}

    embedder = GrpcClient(job["embed"])
    out["info_model_type"] = embedder.info().server_model_type.value
    out["embed"] = [list(v) for v in embedder.embed(texts)]
    out["tokens"] = [r.get_ids() for r in embedder.tokenize(texts[:2])]

    reranker = GrpcClient(job["rerank"])
    ranks = reranker.rerank(query, texts, return_text=True).ranks
    out["rerank"] = [{"index": r.index, "score": r.score, "text": r.text} for r in ranks]

    classifier = GrpcClient(job["classify"])
    singles = classifier.classify(texts)
    pairs = classifier.classify([(query, t) for t in texts])
    out["classify"] = [[(s.label, s.score) for s in r.scores] for r in singles]
    out["classify_pairs"] = [[(s.label, s.score) for s in r.scores] for r in pairs]
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
