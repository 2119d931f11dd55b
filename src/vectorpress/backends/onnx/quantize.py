"""`--backend onnx --dtype int8`: an fp32 graph's linear layers as 8-bit GEMMs.

The recipe is the torch backend's (`backends/torch/int8.py`), which holds cosine >= 0.99 to
float32 where ONNX Runtime's own dynamic quantization (one scale per tensor, 0.977 on the
benchmark corpus) does not: SmoothQuant's per-channel migration of activation outliers into
the weights (alpha 0.5), weights per output channel in 8 bits on CPUs with VNNI and 7 bits
elsewhere (ONNX Runtime's AVX2 kernel sums pairs of u8 x s8 products in 16 bits with saturation,
as fbgemm's does), and activations per
token: each row is divided by its own scale into a range fixed at calibration, [-low, 1], and
quantized on one fixed scale, so a text's vector does not depend on its batch-mates. Linear
layers that share their input (attention's Q, K and V) share one quantization and one GEMM.

In the graph, each `MatMul(x, W)` whose weight is a float32 initializer and whose input is per
token (3-D) becomes

    b = x * unsmooth;  s = max(rowmax(b), -rowmin(b) / low);  q = QuantizeLinear(b / s)
    y = MatMulIntegerToFloat(q, W8) * s        (Split back into Q, K, V where merged)

Heads over pooled 2-D inputs (a classifier's pooler and output layer) stay in float32. The
ranges come from the graph's own activations on the packaged calibration texts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

from vectorpress.backends.common.calibration import ALPHA, WEIGHT_LEVELS, row_range, smoothing
from vectorpress.backends.onnx.export import graph_stamp, run_graph
from vectorpress.errors import StartupError

log = logging.getLogger(__name__)

#: Changes whenever what this module writes changes: part of the cache key. The weight levels
#: follow the CPU (`int8.weight_levels`), so a cache shared by other machines keeps one graph each.
RECIPE = f"rows-smooth-a{ALPHA}-w{WEIGHT_LEVELS}-v3"
MS_DOMAIN = "com.microsoft"
REPORT = "quantize.json"
#: Protobuf cannot serialize a message of 2 GiB: graphs whose tensors come near it (an fp32
#: checkpoint of 500M parameters and more, such as a large multilingual encoder with its
#: 250,000-token embedding table) keep them in one file beside the graph, ONNX's external data.
INLINE_BYTES = 2**31 - 2**26


@dataclass
class Linear:
    """Float MatMuls of a graph that read the same per-token input."""

    input: str
    weights: list[np.ndarray]  # each (in, out)
    outputs: list[str]
    positions: list[int]  # of the MatMuls in the graph's node list


def int8_key(graph: Path, calibration: Path) -> str:
    """What an int8 graph was made from: the fp32 graph (path, size, modification time; and
    those of its external data file, where it has one), the calibration texts and the recipe."""
    parts = [*graph_stamp(graph), RECIPE, hashlib.sha256(calibration.read_bytes()).hexdigest()]
    return "int8-" + hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


@dataclass
class Report:
    """What a quantization did, kept as `quantize.json` beside the graph and logged at start-up:
    the GEMMs it turned to int8, and how far the int8 graph's output moved from the fp32 one's
    on the calibration inputs (per input: the cosine of the mean over tokens for per-token
    outputs, the largest absolute difference for others, such as a classifier's logits)."""

    gemms: int
    min_cosine: float | None
    max_abs_diff: float

    def save(self, folder: Path) -> None:
        (folder / REPORT).write_text(json.dumps(self.__dict__))

    @classmethod
    def load(cls, folder: Path) -> Report | None:
        try:
            return cls(**json.loads((folder / REPORT).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def __str__(self) -> str:
        cos = "" if self.min_cosine is None else f"lowest cosine {self.min_cosine:.4f}, "
        return (
            f"{self.gemms} GEMMs in int8; against fp32 on the calibration texts: {cos}"
            f"largest difference {self.max_abs_diff:.4g}"
        )


def quantize_graph(graph: Path, out: Path, feeds: list[dict[str, np.ndarray]]) -> Report:
    """Write `graph` with its per-token linear layers in int8 to `out`, calibrated on `feeds`
    (one unpadded input each), and report how it did (also saved beside `out`)."""
    model = onnx.load(str(graph))
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < 13:
        raise StartupError(f"{graph} uses ONNX opset {opset}; --dtype int8 needs 13 or later")
    linears = _linears(model)
    outputs = [o.name for o in model.graph.output]
    if linears:
        scratch = out.parent / "probe"
        try:
            names = outputs + [lin.input for lin in linears]
            activations = _calibrate(model, names, feeds, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        linears = [lin for lin in linears if activations[lin.input][0].ndim == 3]
    if not linears:
        raise StartupError(
            f"{graph} has no float32 MatMul over tokens to quantize (is it quantized "
            "already?): serve it without --dtype int8"
        )
    replaced: dict[int, list[NodeProto]] = {}
    initializers: list[TensorProto] = []
    for i, lin in enumerate(linears):
        rows = np.concatenate([a.reshape(-1, a.shape[-1]) for a in activations[lin.input]])
        nodes, consts = _int8_linear(lin, rows, f"vp_int8_{i}_", opset)
        # The merged GEMM goes where the first of its MatMuls was; the others go.
        for position in lin.positions:
            replaced[position] = nodes if position == lin.positions[0] else []
        initializers += consts
    graph_nodes = [
        _copy(n)
        for position, node in enumerate(model.graph.node)
        for n in replaced.get(position, [node])
    ]
    del model.graph.node[:]
    model.graph.node.extend(graph_nodes)
    used = {name for node in graph_nodes for name in node.input}
    dropped = {t.name for t in model.graph.initializer} - used
    # Deleted in place: a copy of a tensor of 2 GiB or more (an embedding table) fails.
    # Graphs of IR version 3 list their initializers as inputs too.
    for field in (model.graph.initializer, model.graph.input):
        for i in reversed(range(len(field))):
            if field[i].name in dropped:
                del field[i]
    model.graph.initializer.extend(initializers)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(onnx.helper.make_opsetid(MS_DOMAIN, 1))
    save_graph(model, out)
    report = _compare(out, feeds, outputs, [activations[name] for name in outputs], len(linears))
    report.save(out.parent)
    return report


def _tensor_bytes(model: ModelProto) -> int:
    # One tensor of 2 GiB or more cannot tell its ByteSize() either: its raw bytes are counted.
    graph = model.graph
    tensors = sum(len(t.raw_data) or t.ByteSize() for t in graph.initializer)
    return tensors + sum(n.ByteSize() for n in graph.node)


def save_graph(model: ModelProto, path: Path) -> None:
    """`model` at `path`; its tensors in `<path>.data` beside it when, with them, it would
    reach protobuf's 2 GiB. (Saving that way moves the tensors out of `model` itself.)"""
    if _tensor_bytes(model) < INLINE_BYTES:
        onnx.save(model, str(path))
        return
    onnx.save(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=path.name + ".data",
        size_threshold=1024,
    )


def _session(model: ModelProto, options: Any, scratch: Path) -> Any:
    """A CPU session on `model`: from memory, or, too large for that, from a file in
    `scratch`, which the caller removes."""
    import onnxruntime as ort

    providers = ["CPUExecutionProvider"]
    if _tensor_bytes(model) < INLINE_BYTES:
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    scratch.mkdir(parents=True, exist_ok=True)
    save_graph(model, scratch / "model.onnx")
    return ort.InferenceSession(str(scratch / "model.onnx"), options, providers=providers)


def _compare(
    graph: Path,
    feeds: list[dict[str, np.ndarray]],
    outputs: list[str],
    reference: list[list[np.ndarray]],
    gemms: int,
) -> Report:
    import onnxruntime as ort

    session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
    cosines: list[float] = []
    diff = 0.0
    for n, feed in enumerate(feeds):
        got = run_graph(session, outputs, feed)
        for want, value in zip((ref[n] for ref in reference), got, strict=True):
            value = np.asarray(value, dtype=np.float32)
            diff = max(diff, float(np.abs(value - want).max()))
            if value.ndim == 3:  # (1, tokens, hidden)
                a, b = want[0].mean(0), value[0].mean(0)
                cosines.append(float(a @ b / max(np.linalg.norm(a) * np.linalg.norm(b), 1e-12)))
    return Report(gemms, min(cosines) if cosines else None, diff)


def _linears(model: ModelProto) -> list[Linear]:
    graph = model.graph
    weights = {
        t.name: t
        for t in graph.initializer
        if len(t.dims) == 2 and t.data_type == TensorProto.FLOAT
    }
    by_input: dict[str, Linear] = {}
    for position, node in enumerate(graph.node):
        if node.op_type == "MatMul" and node.input[1] in weights:
            w = numpy_helper.to_array(weights[node.input[1]]).astype(np.float32)
            lin = by_input.setdefault(node.input[0], Linear(node.input[0], [], [], []))
            lin.weights.append(w)
            lin.outputs.append(node.output[0])
            lin.positions.append(position)
    return list(by_input.values())


def _copy(node: NodeProto) -> NodeProto:
    """A detached copy: the graph's node list is cleared before it is refilled."""
    out = NodeProto()
    out.CopyFrom(node)
    return out


def _calibrate(
    model: ModelProto, names: list[str], feeds: list[dict[str, np.ndarray]], scratch: Path
) -> dict[str, list[np.ndarray]]:
    """The values of `names` on every calibration input, from the fp32 graph itself (written to
    `scratch` if too large to pass in memory)."""
    import onnxruntime as ort

    probe = ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    for name in names:
        if name not in present:
            probe.graph.output.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, None))
    options = ort.SessionOptions()
    # The probe reads intermediate tensors: fusions must not remove them.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = _session(probe, options, scratch)
    del probe  # the session holds its own copy of the weights
    seen: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for feed in feeds:
        values = run_graph(session, names, feed)
        for name, value in zip(names, values, strict=True):
            seen[name].append(np.asarray(value, dtype=np.float32))
    return seen


def _int8_linear(
    lin: Linear, rows: np.ndarray, p: str, opset: int
) -> tuple[list[NodeProto], list[TensorProto]]:
    """The nodes and initializers that compute `lin` in int8, given its calibration rows."""
    consts: list[TensorProto] = []

    def const(name: str, value: np.ndarray) -> str:
        consts.append(numpy_helper.from_array(value, p + name))
        return p + name

    def node(op: str, inputs: list[str], output: str, **attrs: Any) -> NodeProto:
        domain = MS_DOMAIN if op == "MatMulIntegerToFloat" else ""
        return helper.make_node(op, inputs, [output], domain=domain, **attrs)

    def row_reduce(op: str, x: str, output: str) -> NodeProto:
        # Opset 18 made a reduction's axes an input instead of an attribute.
        if opset >= 18:
            return node(op, [x, const("axes", np.array([-1], np.int64))], output, keepdims=1)
        return node(op, [x], output, axes=[-1], keepdims=1)

    weight = np.concatenate(lin.weights, axis=1)  # (in, out): torch's layout transposed
    amax = torch.from_numpy(np.abs(rows).max(0))
    smooth = smoothing(torch.from_numpy(weight.T), amax, ALPHA).numpy()
    scaled = rows / smooth
    # How far below zero a row reaches, relative to its top: 1 for symmetric inputs, less
    # after GELU; a row that goes lower at serving time gets a coarser scale, not clipped.
    low = row_range(float((-scaled.min(1) / np.maximum(scaled.max(1), 1e-12)).max()))
    a_scale = np.array((1 + low) / 255, np.float32)
    a_zero = np.array(round(low / float(a_scale)), np.uint8)
    w = weight * smooth[:, None]
    w_scale = (np.abs(w).max(0) / WEIGHT_LEVELS).clip(1e-12).astype(np.float32)
    w8 = np.round(w / w_scale).astype(np.int8)
    y = p + "y" if len(lin.outputs) > 1 else lin.outputs[0]
    unsmooth = const("unsmooth", (1 / smooth).astype(np.float32))
    nodes = [
        node("Mul", [lin.input, unsmooth], p + "b"),
        row_reduce("ReduceMax", p + "b", p + "hi"),
        row_reduce("ReduceMin", p + "b", p + "lo"),
        node("Mul", [p + "lo", const("neglow", np.array(-1 / low, np.float32))], p + "lo_up"),
        node("Max", [p + "hi", p + "lo_up", const("tiny", np.array(1e-12, np.float32))], p + "s"),
        node("Div", [p + "b", p + "s"], p + "n"),
        node(
            "QuantizeLinear", [p + "n", const("a_scale", a_scale), const("a_zero", a_zero)], p + "q"
        ),
        node(
            "MatMulIntegerToFloat",
            [p + "q", const("w8", w8), p + "a_scale", const("w_scale", w_scale), p + "a_zero"],
            p + "f",
        ),
        node("Mul", [p + "f", p + "s"], y),
    ]
    if len(lin.outputs) > 1:
        sizes = const("sizes", np.array([x.shape[1] for x in lin.weights], np.int64))
        nodes.append(helper.make_node("Split", [y, sizes], lin.outputs, axis=-1))
    return nodes, consts
