"""Export a checkpoint's encoder to an ONNX graph that --backend onnx serves.

    python -m vectorpress.backends.onnx.export MODEL_FOLDER OUT_FOLDER

OUT_FOLDER gets model.onnx (fp32, dynamic batch and length) next to links to the model's
config, tokenizer and sentence-transformers files, so it can be served as it is. Needs the
`onnx` package and transformers.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

GRAPH_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def export_encoder(model_folder: Path, graph: Path, opset: int = 17) -> Path:
    """Trace transformers' AutoModel into `graph`; its output is last_hidden_state."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_folder), attn_implementation="eager").eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(
            self,
            input_ids: torch.Tensor,
            attention_mask: torch.Tensor,
            token_type_ids: torch.Tensor,
        ) -> torch.Tensor:
            out = self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            )
            return out.last_hidden_state

    ids = torch.ones(2, 7, dtype=torch.long)
    axes = {name: {0: "batch", 1: "sequence"} for name in (*GRAPH_INPUTS, "last_hidden_state")}
    graph.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        Encoder(),
        (ids, ids, torch.zeros_like(ids)),
        str(graph),
        input_names=list(GRAPH_INPUTS),
        output_names=["last_hidden_state"],
        dynamic_axes=axes,
        dynamo=False,
        opset_version=opset,
    )
    return graph


def servable_folder(model_folder: Path, graph: Path, dest: Path) -> Path:
    """`dest` with links to the model's files (weights left out) and `graph` as model.onnx."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in model_folder.iterdir():
        link = dest / item.name
        if item.suffix not in (".safetensors", ".bin", ".onnx") and not link.exists():
            link.symlink_to(item.resolve())
    target = dest / "model.onnx"
    if not target.exists():
        target.symlink_to(graph.resolve())
    return dest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args()
    graph = export_encoder(args.model, args.out / "graph" / "model.onnx")
    print(servable_folder(args.model, graph, args.out))


if __name__ == "__main__":
    main()
