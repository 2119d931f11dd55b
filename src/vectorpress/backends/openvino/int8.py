"""--backend openvino --dtype int8: the encoder's linear weights in 8 bits, compressed in place.

Each `MatMul` over per-token activations whose weight is a float32 constant gets that weight as
int8 per output channel (symmetric, 127 levels) times one float32 scale per channel: the pattern
(Constant i8 -> Convert -> Multiply -> MatMul) that OpenVINO's CPU plugin runs as a compressed
FullyConnected, quantizing each row of activations on the fly, per 128 inputs (the backend's
`INT8_GROUP`). Weight-only in the graph, with no calibration: on all-MiniLM-L6-v2 every text of
the benchmark corpus keeps cosine >= 0.994 to float32. Static int8 (per-tensor activation
scales calibrated by NNCF, SmoothQuant 0.5 or 0.95) fell to 0.969-0.977, under the 0.99 bound
(docs/performance.md).
Heads over one vector per text (a classifier's pooler and output layer) stay float32. The
plugin picks its kernel by the pass's shape, so a text's vector alone and inside a batch agree to
cosine 0.9999 (tested), not bit for bit as on the torch and ONNX int8 paths. With the on-the-fly
quantization off (DYNAMIC_QUANTIZATION_GROUP_SIZE 0) the weights are widened to fp32 for every
GEMM instead, at under half the speed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

LEVELS = 127


def compress_weights(model: Any) -> int:
    """Rewrite `model` (an `openvino.Model`) in place; returns how many weights it compressed."""
    import openvino as ov
    import openvino.opset13 as ops

    done = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "MatMul":
            continue
        weight = node.input_value(1).get_node()
        activations = node.input_value(0).get_partial_shape()
        if (
            weight.get_type_name() != "Constant"
            or weight.get_output_element_type(0) != ov.Type.f32
            or len(weight.get_output_partial_shape(0)) != 2
            or activations.rank.is_dynamic
            or activations.rank.get_length() != 3  # (batch, tokens, features): per token
        ):
            continue
        w = weight.get_data().astype(np.float32)
        # The output channel is the weight's last axis, or its first under transpose_b.
        axis = 1 if node.get_attributes()["transpose_b"] else 0
        scale = np.abs(w).max(axis=axis, keepdims=True) / LEVELS
        scale[scale == 0] = 1.0
        q = np.clip(np.rint(w / scale), -LEVELS, LEVELS).astype(np.int8)
        decompressed = ops.multiply(
            ops.convert(ops.constant(q), ov.Type.f32), ops.constant(scale.astype(np.float32))
        )
        node.input(1).replace_source_output(decompressed.output(0))
        done += 1
    model.validate_nodes_and_infer_types()
    return done
