"""What the served model is, read once from config.json and the sentence-transformers files."""

from __future__ import annotations

import json
import logging
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vectorpress.errors import StartupError
from vectorpress.hub import resolve_model
from vectorpress.settings import ModelSettings
from vectorpress.types import OutputKind

log = logging.getLogger(__name__)

#: Models whose position ids start after the padding index (fairseq heritage).
_OFFSET_POSITION_MODELS = ("xlm-roberta", "camembert", "roberta", "mpnet")
_LEGACY_ST_CONFIGS = (
    "sentence_bert_config.json",
    "sentence_roberta_config.json",
    "sentence_distilbert_config.json",
    "sentence_camembert_config.json",
    "sentence_albert_config.json",
    "sentence_xlm-roberta_config.json",
    "sentence_xlnet_config.json",
)
_ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
}


@dataclass(frozen=True)
class DenseSpec:
    """One sentence-transformers Dense module, applied to pooled vectors in order."""

    path: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str


@dataclass(frozen=True)
class M3Spec:
    """bge-m3's two heads beside its encoder (BAAI's layout: `colbert_linear.pt` and
    `sparse_linear.pt`, torch state dicts of nn.Linear). Dense stays the pooled CLS vector."""

    colbert_path: Path
    sparse_path: Path
    colbert_dim: int
    unused_token_ids: tuple[int, ...]
    """Tokens that get no lexical weight: the tokenizer's cls, eos, pad and unk, as FlagEmbedding
    drops them."""


@dataclass(frozen=True)
class ColbertSpec:
    """A ColBERT model in PyLate's layout (config_sentence_transformers.json `model_type`
    ColBERT): prefixes inserted after the first token, queries expanded with mask tokens to
    `query_length`, documents without their skip-list tokens, a bias-free projection."""

    query_prefix_id: int | None
    document_prefix_id: int | None
    query_length: int
    document_length: int
    expansion: bool
    """Queries are padded with `mask_token_id` to `query_length`."""
    attend_to_expansion: bool
    mask_token_id: int
    skiplist_ids: tuple[int, ...]
    dense: tuple[DenseSpec, ...]

    @property
    def dim(self) -> int:
        return self.dense[-1].out_features


#: Qwen3-Reranker's prompt, from its model card; the pair's text goes between prefix and suffix.
QWEN3_RERANKER_PREFIX = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
    'and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n"
)
QWEN3_RERANKER_TEMPLATE = "<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
QWEN3_RERANKER_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
QWEN3_RERANKER_INSTRUCTION = (
    "Given a web search query, retrieve relevant passages that answer the query"
)


@dataclass(frozen=True)
class LlmRerankSpec:
    """A causal LM served as a reranker: each pair is written into a prompt, and its score is
    read from the logits of the answer tokens at the last position (P(yes) over yes and no, or
    one token's logit through a sigmoid)."""

    prefix: str
    template: str
    suffix: str
    instruction: str
    yes_id: int
    no_id: int | None


@dataclass(frozen=True)
class ModelSpec:
    """Everything the pipeline and the backends need to know about the model."""

    path: Path
    config: dict[str, Any]
    architecture: str
    model_type: str
    kind: str
    """embedding, classifier or reranker."""
    pooling: str | None
    """cls, mean, splade or last_token for embedding models; None for classifiers."""
    id2label: dict[int, str] = field(default_factory=dict)
    max_input_length: int = 512
    position_offset: int = 0
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt: str | None = None
    dense: tuple[DenseSpec, ...] = ()
    hidden_size: int = 0
    vocab_size: int = 0
    pad_token_id: int = 0
    m3: M3Spec | None = None
    """Set for a bge-m3 folder: sparse and ColBERT outputs from the same forward pass."""
    colbert: ColbertSpec | None = None
    """Set for a PyLate ColBERT folder: per-token vectors only."""
    llm_rerank: LlmRerankSpec | None = None
    """Set for a causal LM served as a reranker (see `is_llm_reranker`)."""

    @property
    def outputs(self) -> tuple[str, ...]:
        """What the model offers, as /info lists it: dense, sparse, colbert, scores."""
        if self.kind != "embedding":
            return ("scores",)
        if self.m3 is not None:
            return ("dense", "sparse", "colbert")
        if self.colbert is not None:
            return ("colbert",)
        return ("sparse",) if self.is_splade else ("dense",)

    @property
    def family(self) -> str | None:
        """The model kind beyond its architecture, as /info and /v1/models name it."""
        if self.m3 is not None:
            return "bge-m3"
        if self.colbert is not None:
            return "colbert"
        if self.llm_rerank is not None:
            return "llm-reranker"
        return None

    @property
    def windows(self) -> bool:
        """Whether long inputs can be windowed: pooled embeddings and cross-encoder scores;
        never per-token vectors or an LLM reranker's prompts."""
        return self.colbert is None and self.llm_rerank is None

    @property
    def probe_kind(self) -> OutputKind:
        """What a warm-up or health probe asks for: a ColBERT model pools nothing."""
        return OutputKind.MULTI if self.colbert is not None else OutputKind.POOLED

    @property
    def has_sparse(self) -> bool:
        return self.is_splade or self.m3 is not None

    @property
    def has_multi_vector(self) -> bool:
        return self.m3 is not None or self.colbert is not None

    @property
    def has_token_types(self) -> bool:
        """Whether the model tells token types apart. RoBERTa's single type embedding (and
        models with none) would be indexed past by the type 1 that BERT's pair template writes
        on a second text: their inputs get type 0 throughout."""
        return int(self.config.get("type_vocab_size") or 0) > 1

    @property
    def is_splade(self) -> bool:
        return self.pooling == "splade"

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @property
    def label2id(self) -> dict[str, int]:
        return {label: i for i, label in self.id2label.items()}

    @property
    def embedding_size(self) -> int:
        if self.is_splade:
            return self.vocab_size
        if self.colbert is not None:
            return self.colbert.dim
        return self.dense[-1].out_features if self.dense else self.hidden_size

    def info_model_type(self) -> dict[str, Any]:
        """The `model_type` object of /info, externally tagged as TEI does."""
        info: dict[str, Any]
        if self.kind == "embedding":
            info = {"pooling": self.pooling}
        else:
            labels = {str(i): label for i, label in sorted(self.id2label.items())}
            info = {"id2label": labels, "label2id": self.label2id}
        # TEI's fields as TEI gives them; the kinds TEI lacks add what they are and offer.
        if self.family is not None:
            info["family"] = self.family
            info["outputs"] = list(self.outputs)
        return {self.kind: info}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise StartupError(f"cannot read {path}: {exc}") from exc


def _pooling_from_st(folder: Path, modules: list[dict[str, Any]]) -> str | None:
    pooling_dir = folder / "1_Pooling"
    for module in modules:
        if module.get("type", "").endswith("models.Pooling"):
            pooling_dir = folder / module.get("path", "1_Pooling")
    cfg_path = pooling_dir / "config.json"
    if not cfg_path.is_file():
        return None
    cfg = _read_json(cfg_path)
    # TEI's priority when several modes are on.
    if cfg.get("pooling_mode_cls_token"):
        return "cls"
    if cfg.get("pooling_mode_mean_tokens"):
        return "mean"
    if cfg.get("pooling_mode_lasttoken"):
        return "last_token"
    modes = [k for k, v in cfg.items() if k.startswith("pooling_mode") and v]
    raise StartupError(f"pooling {modes} of {cfg_path} is not supported; pass --pooling")


def _dense_modules(
    folder: Path, modules: list[dict[str, Any]], dense_path: str | None
) -> tuple[DenseSpec, ...]:
    paths = [folder / m["path"] for m in modules if m.get("type", "").endswith("models.Dense")]
    if dense_path is not None:
        if len(paths) == 1:
            paths = [folder / dense_path]
        elif len(paths) > 1:
            log.warning("--dense-path ignored: modules.json lists %d Dense modules", len(paths))
        else:
            paths = [folder / dense_path]
    out = []
    for path in paths:
        cfg = _read_json(path / "config.json")
        name = cfg.get("activation_function", "torch.nn.modules.linear.Identity")
        if name not in _ACTIVATIONS:
            raise StartupError(f"Dense activation {name} in {path} is not supported")
        out.append(
            DenseSpec(
                path=path,
                in_features=int(cfg["in_features"]),
                out_features=int(cfg["out_features"]),
                bias=bool(cfg.get("bias", True)),
                activation=_ACTIVATIONS[name],
            )
        )
    return tuple(out)


def _special_token_ids(folder: Path, names: tuple[str, ...]) -> tuple[int, ...]:
    """Ids of the named special tokens (special_tokens_map.json, else tokenizer_config.json)."""
    from tokenizers import Tokenizer

    declared: dict[str, Any] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (folder / name).is_file():
            declared.update(_read_json(folder / name))
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    ids = []
    for name in names:
        token = declared.get(name)
        if isinstance(token, dict):
            token = token.get("content")
        if isinstance(token, str) and (found := tokenizer.token_to_id(token)) is not None:
            ids.append(found)
    return tuple(sorted(set(ids)))


def _m3_spec(folder: Path, hidden: int) -> M3Spec | None:
    colbert, sparse = folder / "colbert_linear.pt", folder / "sparse_linear.pt"
    if not colbert.is_file() and not sparse.is_file():
        return None
    if not (colbert.is_file() and sparse.is_file()):
        missing = sparse if colbert.is_file() else colbert
        raise StartupError(f"a bge-m3 folder needs both heads; {missing.name} is missing")
    import torch

    def shape(path: Path) -> tuple[int, ...]:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise StartupError(f"cannot read {path}: {exc}") from exc
        weight = state.get("weight") if isinstance(state, dict) else None
        if weight is None:
            raise StartupError(f"{path} holds no `weight`")
        return tuple(weight.shape)

    colbert_shape, sparse_shape = shape(colbert), shape(sparse)
    if colbert_shape[1:] != (hidden,) or sparse_shape != (1, hidden):
        raise StartupError(
            f"bge-m3 heads do not fit hidden size {hidden}: colbert_linear {colbert_shape}, "
            f"sparse_linear {sparse_shape}"
        )
    unused = _special_token_ids(folder, ("cls_token", "eos_token", "pad_token", "unk_token"))
    return M3Spec(colbert, sparse, colbert_shape[0], unused)


_PYLATE_DENSE = "pylate.models.Dense.Dense"


def _colbert_spec(folder: Path, modules: list[dict[str, Any]], st: dict[str, Any]) -> ColbertSpec:
    from tokenizers import Tokenizer

    dense = []
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith("models.Transformer"):
            continue
        if kind != _PYLATE_DENSE and not kind.endswith("models.Dense"):
            raise StartupError(f"ColBERT module {kind} of {folder} is not supported")
        path = folder / module["path"]
        cfg = _read_json(path / "config.json")
        if cfg.get("use_residual"):
            raise StartupError(f"a residual ColBERT projection ({path}) is not supported")
        name = cfg.get("activation_function") or "torch.nn.modules.linear.Identity"
        if name not in _ACTIVATIONS:
            raise StartupError(f"Dense activation {name} in {path} is not supported")
        dense.append(
            DenseSpec(
                path=path,
                in_features=int(cfg["in_features"]),
                out_features=int(cfg["out_features"]),
                bias=bool(cfg.get("bias", False)),
                activation=_ACTIVATIONS[name],
            )
        )
    if not dense:
        raise StartupError(f"ColBERT folder {folder} has no projection (Dense) module")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    declared: dict[str, Any] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        if (folder / name).is_file():
            declared.update(_read_json(folder / name))

    def token_id(token: object) -> int | None:
        if isinstance(token, dict):
            token = token.get("content")
        return tokenizer.token_to_id(token) if isinstance(token, str) and token else None

    def prefix(key: str, default: str) -> int | None:
        text = st.get(key, default)
        if not text:
            return None
        found = token_id(text)
        if found is None:
            raise StartupError(f"the ColBERT {key} {text!r} is not a token of the tokenizer")
        return found

    # PyLate pads queries with the mask token (an encoder's), else the end-of-sequence token.
    mask = token_id(declared.get("mask_token")) or token_id(declared.get("eos_token"))
    if mask is None:
        raise StartupError(f"ColBERT folder {folder}: the tokenizer has no mask or eos token")
    # Words absent from the vocabulary become the unknown token, as PyLate's
    # convert_tokens_to_ids makes them.
    unk = token_id(declared.get("unk_token"))
    words = st.get("skiplist_words")
    skip = set()
    for word in words if words is not None else list(string.punctuation):
        found = tokenizer.token_to_id(word)
        found = unk if found is None else found
        if found is not None:
            skip.add(found)
    expansion = bool(st.get("do_query_expansion", True))
    query_length = int(st.get("query_length") or 32)
    document_length = int(st.get("document_length") or 180)
    for name, value in (("query_length", query_length), ("document_length", document_length)):
        if value < 3:
            raise StartupError(f"ColBERT {name} must be at least 3, got {value}")
    return ColbertSpec(
        query_prefix_id=prefix("query_prefix", "[Q] "),
        document_prefix_id=prefix("document_prefix", "[D] "),
        query_length=query_length,
        document_length=document_length,
        expansion=expansion,
        attend_to_expansion=expansion and bool(st.get("attend_to_expansion_tokens", False)),
        mask_token_id=mask,
        skiplist_ids=tuple(sorted(skip)),
        dense=tuple(dense),
    )


def is_llm_reranker(architecture: str, folder: Path, settings: ModelSettings) -> bool:
    """The documented rule: a *ForCausalLM checkpoint is served as a reranker when
    --llm-reranker says so, or, left unset, when its model id or folder name contains `rerank`
    (Qwen3-Reranker-*, bge-reranker-v2-gemma); the setting wins either way."""
    if settings.llm_reranker is not None:
        if settings.llm_reranker and not architecture.endswith("ForCausalLM"):
            raise StartupError(
                f"--llm-reranker needs a *ForCausalLM model, this one is {architecture}"
            )
        return settings.llm_reranker
    names = f"{settings.model_id} {folder.name}".lower()
    return architecture.endswith("ForCausalLM") and "rerank" in names


def _llm_rerank_spec(folder: Path, settings: ModelSettings) -> LlmRerankSpec:
    from tokenizers import Tokenizer

    path = folder / "tokenizer.json"
    if not path.is_file():
        raise StartupError(f"{folder} has no tokenizer.json (only fast tokenizers are served)")
    tokenizer = Tokenizer.from_file(str(path))
    answer = (settings.reranker_tokens or "yes,no").split(",")
    ids = []
    for token in answer:
        found = tokenizer.token_to_id(token)
        if found is None:
            raise StartupError(
                f"the LLM reranker's answer token {token!r} is not in the vocabulary"
            )
        ids.append(found)
    template = settings.reranker_template or QWEN3_RERANKER_TEMPLATE
    return LlmRerankSpec(
        prefix=QWEN3_RERANKER_PREFIX
        if settings.reranker_prefix is None
        else settings.reranker_prefix,
        template=template,
        suffix=QWEN3_RERANKER_SUFFIX
        if settings.reranker_suffix is None
        else settings.reranker_suffix,
        instruction=settings.reranker_instruction or QWEN3_RERANKER_INSTRUCTION,
        yes_id=ids[0],
        no_id=ids[1] if len(ids) == 2 else None,
    )


def load_model_spec(folder: Path, settings: ModelSettings) -> ModelSpec:
    """Read the model's description and check it against the settings."""
    config = _read_json(folder / "config.json")
    model_type = str(config.get("model_type", ""))
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures else ""

    id2label_raw = config.get("id2label") or {}
    id2label = {int(k): str(v) for k, v in id2label_raw.items()}
    llm_rerank = None
    if architecture.endswith("Classification"):
        if not id2label:
            raise StartupError(f"{architecture} needs id2label in config.json")
        kind = "reranker" if len(id2label) == 1 else "classifier"
    elif is_llm_reranker(architecture, folder, settings):
        llm_rerank = _llm_rerank_spec(folder, settings)
        kind, id2label = "reranker", {0: "LABEL_0"}
    else:
        kind = "embedding"

    modules_path = folder / "modules.json"
    modules: list[dict[str, Any]] = _read_json(modules_path) if modules_path.is_file() else []
    st_model_cfg_path = folder / "config_sentence_transformers.json"
    st_model_cfg = _read_json(st_model_cfg_path) if st_model_cfg_path.is_file() else {}
    colbert = (
        _colbert_spec(folder, modules, st_model_cfg)
        if kind == "embedding" and st_model_cfg.get("model_type") == "ColBERT"
        else None
    )

    if settings.windowed_inputs and (colbert is not None or llm_rerank is not None):
        # Nothing such a model serves is windowed (ModelSpec.windows, Infer._refuse_windows).
        what = "a ColBERT model's per-token vectors" if colbert else "an LLM reranker's prompts"
        raise StartupError(
            f"--windowed-inputs does not apply to {what}; leave it unset for this model"
        )
    pooling: str | None = None
    if colbert is not None:
        if settings.pooling is not None:
            raise StartupError("a ColBERT model has no pooling; leave --pooling unset")
    elif kind == "embedding":
        if settings.pooling is not None:
            pooling = settings.pooling
        else:
            pooling = _pooling_from_st(folder, modules)
            if pooling is None:
                if "bert" in model_type:
                    log.warning("no pooling config found; using cls pooling, as TEI does")
                    pooling = "cls"
                else:
                    raise StartupError(f"no 1_Pooling/config.json in {folder}; pass --pooling")
        if pooling == "splade" and not architecture.endswith("MaskedLM"):
            raise StartupError(
                f"--pooling splade needs a *ForMaskedLM model, this one is {architecture}"
            )
    elif settings.pooling is not None:
        log.warning("--pooling %s ignored: %s is a %s", settings.pooling, architecture, kind)

    position_offset = (
        int(config.get("pad_token_id", 1)) + 1 if model_type in _OFFSET_POSITION_MODELS else 0
    )
    max_positions = config.get("max_position_embeddings") or config.get("max_trained_positions")
    st_cfg: dict[str, Any] = {}
    for name in _LEGACY_ST_CONFIGS:
        if (folder / name).is_file():
            st_cfg = _read_json(folder / name)
            break
    candidates = []
    if colbert is not None:
        # PyLate sets the encoder's max_seq_length per side, past sentence_bert_config's.
        candidates.append(max(colbert.query_length, colbert.document_length))
    elif st_cfg.get("max_seq_length"):
        candidates.append(int(st_cfg["max_seq_length"]))
    if max_positions:
        candidates.append(int(max_positions) - position_offset)
    if not candidates:
        raise StartupError("cannot tell the model's max input length from its config")
    max_input_length = min(candidates)
    if max_input_length > settings.max_batch_tokens:
        if not settings.auto_truncate:
            raise StartupError(
                f"the model's max input length {max_input_length} is larger than "
                f"--max-batch-tokens {settings.max_batch_tokens}; raise it or enable "
                f"--auto-truncate"
            )
        max_input_length = settings.max_batch_tokens

    prompts = {str(k): str(v) for k, v in (st_model_cfg.get("prompts") or {}).items()}
    default_prompt: str | None = None
    if settings.default_prompt is not None:
        default_prompt = settings.default_prompt
    elif settings.default_prompt_name is not None:
        if settings.default_prompt_name not in prompts:
            available = ", ".join(sorted(prompts)) or "none"
            raise StartupError(
                f"--default-prompt-name {settings.default_prompt_name} is not in the model's "
                f"prompts (available: {available})"
            )
        default_prompt = prompts[settings.default_prompt_name]
    elif st_model_cfg.get("default_prompt_name"):
        default_prompt = prompts.get(str(st_model_cfg["default_prompt_name"])) or None

    dense = (
        _dense_modules(folder, modules, settings.dense_path)
        if kind == "embedding" and colbert is None
        else ()
    )
    hidden_size = int(config.get("hidden_size") or config.get("d_model") or config.get("dim") or 0)
    m3 = _m3_spec(folder, hidden_size) if kind == "embedding" else None
    if m3 is not None and pooling != "cls":
        raise StartupError(f"a bge-m3 model pools its dense vector from CLS, not {pooling}")

    return ModelSpec(
        path=folder,
        config=config,
        architecture=architecture,
        model_type=model_type,
        kind=kind,
        pooling=pooling,
        id2label=id2label,
        max_input_length=max_input_length,
        position_offset=position_offset,
        prompts=prompts,
        default_prompt=default_prompt,
        dense=dense,
        hidden_size=hidden_size,
        vocab_size=int(config.get("vocab_size", 0)),
        pad_token_id=int(config.get("pad_token_id") or 0),
        m3=m3,
        colbert=colbert,
        llm_rerank=llm_rerank,
    )


def resolve_model_spec(settings: ModelSettings) -> ModelSpec:
    """The model that `settings` names, found (or downloaded) and read: its files alone, no
    weights loaded."""
    folder = resolve_model(
        settings.model_id,
        settings.revision,
        settings.hf_token,
        settings.huggingface_hub_cache,
        want_onnx=settings.backend in ("onnx", "openvino"),
        dense_path=settings.dense_path,
    )
    return load_model_spec(folder, settings)
