"""FlagEmbedding's BGEM3FlagModel on a folder: dense, lexical weights, ColBERT vectors, scores.

Runs in .venv-ref (see tests/helpers/refvenv.py). Request: {"folder", "texts", "pairs",
"weights"}; each pair is scored alone, so that no other pair's padding enters its ColBERT max.
"""

import json
import sys

from FlagEmbedding import BGEM3FlagModel

with open(sys.argv[1]) as f:
    request = json.load(f)
model = BGEM3FlagModel(request["folder"], use_fp16=False, devices="cpu")
empty = {"dense_vecs": [], "lexical_weights": [], "colbert_vecs": []}
out = empty
if request["texts"]:
    out = model.encode(
        request["texts"],
        batch_size=4,
        return_dense=True,
        return_sparse=True,
        return_colbert_vecs=True,
    )
scores = []
for query, passage in request.get("pairs", []):
    kwargs = {}
    if request.get("weights") is not None:
        kwargs["weights_for_different_modes"] = request["weights"]
    s = model.compute_score([[query, passage]], **kwargs)
    scores.append({k: float(v[0]) for k, v in s.items()})
answer = {
    "dense": [v.tolist() for v in out["dense_vecs"]],
    "sparse": [{str(k): float(w) for k, w in lw.items()} for lw in out["lexical_weights"]],
    "colbert": [v.tolist() for v in out["colbert_vecs"]],
    "scores": scores,
}
with open(sys.argv[2], "w") as f:
    json.dump(answer, f)
