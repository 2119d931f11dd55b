"""What the served model is, read once from config.json and the sentence-transformers files."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vectorpress.errors import StartupError
from vectorpress.settings import ModelSettings

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
        return self.dense[-1].out_features if self.dense else self.hidden_size

    def info_model_type(self) -> dict[str, Any]:
        """The `model_type` object of /info, externally tagged as TEI does."""
        if self.kind == "embedding":
            return {"embedding": {"pooling": self.pooling}}
        labels = {str(i): label for i, label in sorted(self.id2label.items())}
        return {self.kind: {"id2label": labels, "label2id": self.label2id}}


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


def load_model_spec(folder: Path, settings: ModelSettings) -> ModelSpec:
    """Read the model's description and check it against the settings."""
    config = _read_json(folder / "config.json")
    model_type = str(config.get("model_type", ""))
    architectures = config.get("architectures") or []
    architecture = architectures[0] if architectures else ""

    id2label_raw = config.get("id2label") or {}
    id2label = {int(k): str(v) for k, v in id2label_raw.items()}
    if architecture.endswith("Classification"):
        if not id2label:
            raise StartupError(f"{architecture} needs id2label in config.json")
        kind = "reranker" if len(id2label) == 1 else "classifier"
    else:
        kind = "embedding"

    modules_path = folder / "modules.json"
    modules: list[dict[str, Any]] = _read_json(modules_path) if modules_path.is_file() else []

    pooling: str | None = None
    if kind == "embedding":
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
    if st_cfg.get("max_seq_length"):
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

    st_model_cfg_path = folder / "config_sentence_transformers.json"
    st_model_cfg = _read_json(st_model_cfg_path) if st_model_cfg_path.is_file() else {}
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

    dense = _dense_modules(folder, modules, settings.dense_path) if kind == "embedding" else ()

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
        hidden_size=int(
            config.get("hidden_size") or config.get("d_model") or config.get("dim") or 0
        ),
        vocab_size=int(config.get("vocab_size", 0)),
        pad_token_id=int(config.get("pad_token_id") or 0),
    )
