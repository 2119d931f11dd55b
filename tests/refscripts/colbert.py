"""pylate.models.ColBERT on a folder: per-token vectors of queries and documents, MaxSim scores.

Runs in .venv-ref (see tests/helpers/refvenv.py). Request: {"folder", "queries", "documents"};
every query is scored against every document (the sum over query tokens of the best dot
product over document tokens).
"""

import json
import sys

import torch
from pylate import models

with open(sys.argv[1]) as f:
    request = json.load(f)
model = models.ColBERT(request["folder"], device="cpu")
queries = model.encode(request["queries"], is_query=True, batch_size=4, convert_to_numpy=True)
documents = model.encode(request["documents"], is_query=False, batch_size=4, convert_to_numpy=True)
scores = [
    [
        float((torch.from_numpy(q) @ torch.from_numpy(d).T).max(dim=1).values.sum())
        for d in documents
    ]
    for q in queries
]
answer = {
    "queries": [q.tolist() for q in queries],
    "documents": [d.tolist() for d in documents],
    "scores": scores,
}
with open(sys.argv[2], "w") as f:
    json.dump(answer, f)
