"""OpenVinoBackend: the ONNX backend's graph, compiled by OpenVINO for the CPU.

The graph is the one `--backend onnx` serves (the checkpoint's own `model.onnx`, or one exported
from its weights on the first start and cached), read by OpenVINO's ONNX frontend and compiled
once, with dynamic batch and length, on every available CPU. `--dtype bfloat16` compiles the
same graph with bf16 as its inference precision (the weights stay fp32 on disk); `--dtype int8`
compresses its linear weights to 8 bits first (`int8.py`). Batches run as
the ONNX backend's length buckets, and the hidden states come back into the packed layout, so
pooling, Dense modules, SPLADE heads and classification logits are the shared code's.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from vectorpress.backends.common.buckets import padded_inputs
from vectorpress.backends.common.cache import build_cache
from vectorpress.backends.onnx.backend import OnnxBackend, onnx_graph
from vectorpress.cpus import available_cpus, native_bf16, native_int8_dot
from vectorpress.errors import StartupError
from vectorpress.model_spec import ModelSpec
from vectorpress.types import Batch

log = logging.getLogger(__name__)

#: --dtype -> OpenVINO's inference precision hint (int8: weights in 8 bits, see `int8.py`; the
#: ops around its linears in bf16 where the CPU has it, see `compile_config`).
PRECISIONS = {"float32": "f32", "bfloat16": "bf16", "int8": "f32"}
# Activations quantized on the fly per 128 of a linear's inputs under --dtype int8: on MiniLM
# (Zen 4, with the bf16 below) 1.3x bf16 in-process and 1.1x over HTTP at cosine 0.995 (mpnet:
# 1.3-1.5x over HTTP at 0.997), where the plugin's default of 32 ran level with bf16 at 0.998;
# 256, which does not divide 384, ran slower.
INT8_GROUP = 128
# Where the CPU has no VNNI nor AMX, the plugin quantizes no activations: its int8 linears
# multiply the weights decompressed to f32 (`brgemm_avx2_f32` with i8 weights), which on a Zen 3
# ran 0.86x float32 in-process, at any group size. AVX-VNNI counts as VNNI here (no such CPU was
# measured).
WEIGHT_ONLY = (
    "openvino int8 on a CPU without VNNI or AMX multiplies its 8-bit weights in float32, slower "
    "than --dtype float32 here; --backend onnx or torch --dtype int8 quantize activations on AVX2"
)
# Padded tokens per run at most: 4,096 measured level with 2,048 and 8,192 on MiniLM (see
# docs/performance.md); OpenVINO keeps no arena of the largest run, unlike ONNX Runtime.
PASS_TOKENS = 4096


class OpenVinoBackend(OnnxBackend):
    """Runs an ONNX encoder graph compiled by OpenVINO (fp32 or bf16 inference)."""

    name = "openvino"
    pass_tokens = PASS_TOKENS

    def __init__(
        self,
        spec: ModelSpec,
        device: str = "cpu",
        dtype: str | None = None,
        cache_dir: Path | None = None,
    ) -> None:
        """The signature every backend shares (see `backends.base.Backend`); the exported
        graph is kept under `cache_dir` (`common.cache.build_cache()` when not given)."""
        try:
            import openvino as ov
        except ImportError:
            raise StartupError(
                "--backend openvino needs openvino: pip install 'vectorpress[openvino]'"
            ) from None
        dtype = dtype or "float32"
        if dtype not in PRECISIONS:
            raise StartupError(
                f"--backend openvino runs float32, bfloat16 or int8; --dtype {dtype} cannot apply"
            )
        if device == "cuda":
            raise StartupError("--backend openvino runs on the CPU only: --device cpu or auto")
        if dtype == "bfloat16" and not native_bf16():
            raise StartupError(
                "--backend openvino --dtype bfloat16 needs a CPU with AVX512-BF16 or AMX; "
                "this one has neither: serve float32"
            )
        self.spec = spec
        self.device = "cpu"
        self.dtype = dtype
        self.path = onnx_graph(spec, cache_dir or build_cache())
        started = time.perf_counter()
        core = ov.Core()
        config = compile_config(dtype, native_bf16())
        try:
            model = core.read_model(str(self.path))
            if dtype == "int8":
                from vectorpress.backends.openvino.int8 import compress_weights

                compressed = compress_weights(model)
                if not compressed:
                    raise StartupError(
                        f"{self.path} has no float32 linear weight to compress to int8: "
                        "serve it without --dtype int8"
                    )
                log.info("openvino int8: %d linear weights in 8 bits", compressed)
                if not native_int8_dot():
                    log.warning(WEIGHT_ONLY)
            self.compiled = core.compile_model(model, "CPU", config)
        except StartupError:
            raise
        except Exception as exc:  # OpenVINO raises RuntimeError with its own long message
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise StartupError(f"OpenVINO cannot compile {self.path}: {first}") from exc
        self.request = self.compiled.create_infer_request()
        outputs = {o.get_any_name(): o for o in self.compiled.outputs}
        self._heads(
            {i.get_any_name() for i in self.compiled.inputs},
            {name: _dims(o.get_partial_shape()) for name, o in outputs.items()},
        )
        self.port = outputs[self.output]
        log.info(
            "openvino %s: %s compiled for %s (%s) in %.2f s",
            ov.__version__,
            self.path,
            config["INFERENCE_PRECISION_HINT"],
            self.compiled.get_property("INFERENCE_NUM_THREADS"),
            time.perf_counter() - started,
        )

    def _run(self, batch: Batch, group: list[int]) -> np.ndarray:
        inputs = padded_inputs(batch, group, token_types=self.spec.has_token_types)
        feeds = {k: v for k, v in inputs.items() if k in self.inputs}
        self.request.infer(feeds, share_inputs=True)
        # The request's own output buffer is reused by the next run: the caller copies it.
        return np.asarray(self.request.get_tensor(self.port).data)


def compile_config(dtype: str, bf16: bool) -> dict[str, Any]:
    """The CPU plugin's settings for `dtype` on a CPU with (`bf16`) or without native bf16."""
    config: dict[str, Any] = {
        "INFERENCE_PRECISION_HINT": PRECISIONS[dtype],
        # One request at a time on every core: the model thread runs one batch at a time.
        "PERFORMANCE_HINT": "LATENCY",
        "NUM_STREAMS": 1,
        "INFERENCE_NUM_THREADS": available_cpus(),
    }
    if dtype == "int8":
        config["DYNAMIC_QUANTIZATION_GROUP_SIZE"] = INT8_GROUP
        if bf16:
            # Attention, the reorders around it and the linears' outputs then run in bf16: the
            # int8 linears alone left those ops at fp32's cost, and int8 level with bf16.
            config["INFERENCE_PRECISION_HINT"] = "bf16"
    return config


def _dims(shape: Any) -> list[int | None]:
    """An OpenVINO partial shape as a list, None for each dynamic dimension."""
    return [d.get_length() if d.is_static else None for d in shape]
