"""Make a PyLate ColBERT folder from a tiny base folder: pylate.models.ColBERT(base).save(dest).

Runs in .venv-ref (see tests/helpers/refvenv.py). Request: {"base", "dest", "embedding_size",
"seed", and optional ColBERT arguments (query_length, document_length,
attend_to_expansion_tokens...)}.
"""

import json
import sys

import torch
from pylate import models

with open(sys.argv[1]) as f:
    request = json.load(f)
torch.manual_seed(request.get("seed", 0))
options = request.get("options", {})
model = models.ColBERT(
    model_name_or_path=request["base"],
    embedding_size=request["embedding_size"],
    device="cpu",
    **options,
)
model.save(request["dest"])
with open(sys.argv[2], "w") as f:
    json.dump({"saved": request["dest"]}, f)
