"""Pick the backend for a model and the hardware, in one documented order, and say why.

Order: an explicit `--backend` wins; otherwise the native torch backend when the model's
`model_type` is in the registry and the checkpoint needs nothing the native model lacks (a
rotary scaling variant, a masked-LM head for SPLADE), else the transformers fallback.
"""

from __future__ import annotations

import logging
from typing import Any

from vectorpress.backends.base import Backend
from vectorpress.backends.common.cache import build_cache
from vectorpress.errors import StartupError
from vectorpress.model_spec import ModelSpec
from vectorpress.settings import ModelSettings

log = logging.getLogger(__name__)


def backend_args(settings: ModelSettings, dtype: str | None = None) -> dict[str, Any]:
    """The arguments every backend's constructor takes, after the model's spec (`dtype`: the
    one `--dtype auto` picked)."""
    return {
        "device": settings.device,
        "dtype": dtype if settings.dtype == "auto" else settings.dtype,
        "cache_dir": build_cache(settings.huggingface_hub_cache),
    }


def select_backend(spec: ModelSpec, settings: ModelSettings) -> Backend:
    from vectorpress.backends.torch.registry import lookup

    choice = settings.backend
    if choice == "auto":
        arch = lookup(spec.model_type)
        refusal = arch.refusal(spec.config, spec.is_splade) if arch is not None else None
        if arch is None:
            choice, why = "hf", f"model_type {spec.model_type!r} has no native model"
        elif refusal is not None:
            choice, why = "hf", f"model_type {spec.model_type!r} is native, but {refusal}"
        else:
            choice, why = "torch", f"model_type {spec.model_type!r} has a native packed model"
    else:
        why = "--backend asked for it"
    # The transformers fallback runs whole HF heads; these kinds need heads of their own on
    # the hidden states, which the native and ONNX backends apply.
    if spec.llm_rerank is not None and choice not in ("torch", "onnx"):
        raise StartupError(
            f"LLM rerankers run on --backend torch (the native decoders) or onnx, not {choice}: "
            f"{why}"
        )
    if spec.has_multi_vector and choice not in ("torch", "onnx"):
        raise StartupError(
            f"multi-vector models (bge-m3, ColBERT) run on --backend torch or onnx, not {choice}"
        )
    log.info("backend %s serves %s: %s", choice, spec.architecture, why)
    if settings.dtype == "auto":
        from vectorpress.backends import dtype_choice
        from vectorpress.backends.common.device import pick_device

        device = pick_device(settings.device)
        return dtype_choice.choose(
            spec, device, choice, lambda dtype: build(choice, spec, settings, dtype)
        )
    return build(choice, spec, settings)


def build(
    choice: str, spec: ModelSpec, settings: ModelSettings, dtype: str | None = None
) -> Backend:
    """Backend `choice` for `spec` (`dtype`: the one `--dtype auto` picked)."""
    from vectorpress.backends.torch.backend import TorchBackend

    if choice == "torch":
        args = backend_args(settings, dtype)
        return TorchBackend(spec, **args, cuda_graphs=settings.cuda_graphs)
    if choice == "hf":
        from vectorpress.backends.hf.backend import HFBackend

        return HFBackend(spec, **backend_args(settings, dtype))
    if choice == "onnx":
        try:
            from vectorpress.backends.onnx.backend import OnnxBackend
        except ImportError as exc:  # onnxruntime is an optional extra
            raise StartupError(
                f"the onnx backend needs `pip install vectorpress[onnx]`: {exc}"
            ) from None
        return OnnxBackend(spec, **backend_args(settings, dtype))
    if choice == "openvino":
        try:
            from vectorpress.backends.openvino.backend import OpenVinoBackend
        except ImportError as exc:  # onnx (the graph's exporter) is an optional extra too
            raise StartupError(
                f"the openvino backend needs `pip install vectorpress[openvino]`: {exc}"
            ) from None
        return OpenVinoBackend(spec, **backend_args(settings, dtype))
    raise StartupError(f"unknown backend {choice}")
