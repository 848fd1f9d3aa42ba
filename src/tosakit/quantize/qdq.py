"""Reading a converted (quantize/dequantize) graph: qparams and integer regions."""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np
import torch
from torch.fx import Node

from ..capture import graph_attr
from .annotate import FUSABLE_ACTIVATIONS

qd = torch.ops.quantized_decomposed
QUANTIZE_OPS = {qd.quantize_per_tensor.default, qd.quantize_per_tensor.tensor, qd.quantize_per_channel.default}
DEQUANTIZE_OPS = {qd.dequantize_per_tensor.default, qd.dequantize_per_tensor.tensor, qd.dequantize_per_channel.default}


INTEGER_KEY = "tosakit_integer"


@dataclass(frozen=True)
class QParams:
    """Affine integer quantization of one tensor: real = (q - zero_point) * scale."""

    scale: np.ndarray  # shape () per tensor, (C,) per channel
    zero_point: np.ndarray
    qmin: int
    qmax: int
    dtype: torch.dtype
    axis: int | None = None

    @property
    def per_channel(self) -> bool:
        return self.axis is not None

    @property
    def s(self) -> float:
        """The per-tensor scale as a float."""
        return float(self.scale)

    @property
    def zp(self) -> int:
        """The per-tensor zero point as an int."""
        return int(self.zero_point)

    def broadcast(self, dim: int, dtype: torch.dtype = torch.float32) -> tuple:
        """(scale, zero point) shaped to broadcast over a ``dim``-dimensional tensor."""
        if not self.per_channel:
            return self.s, self.zp
        shape = [1] * dim
        shape[self.axis] = -1
        return (torch.as_tensor(self.scale).to(dtype).reshape(shape),
                torch.as_tensor(self.zero_point).reshape(shape))

    def steps(self, x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """round(x / scale) + zero point, before clamping, with the scale in ``dtype``."""
        scale, zp = self.broadcast(x.dim(), dtype)
        return torch.round(x / scale) + zp

    def quantize(self, x: torch.Tensor) -> torch.Tensor:
        """Float to integer exactly as the quantized_decomposed kernels do."""
        return torch.clamp(self.steps(x), self.qmin, self.qmax).to(self.dtype)

    def dequantize(self, q: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Integer to float (float64 for exact evaluation)."""
        scale, zp = self.broadcast(q.dim(), dtype)
        x = q.to(dtype, copy=True)  # one new tensor, changed in place: a 28M-weight lm_head is 226 MB in float64
        return x.sub_(zp).mul_(scale)


def is_quantize(node) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in QUANTIZE_OPS


def is_dequantize(node) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in DEQUANTIZE_OPS


def _literal(arg, gm=None) -> np.ndarray:
    if isinstance(arg, Node):
        if arg.op != "get_attr" or gm is None:
            raise ValueError(f"qparam {arg.name} is not a constant")
        return graph_attr(gm, arg).detach().cpu().numpy()
    return np.asarray(arg)


def qparams_of(node: Node, gm=None) -> QParams:
    """QParams of a quantize/dequantize node (``gm`` resolves per-channel constants)."""
    args = node.args
    if node.target in (qd.quantize_per_channel.default, qd.dequantize_per_channel.default):
        _, scale, zp, axis, qmin, qmax, dtype = args[:7]
        return QParams(_literal(scale, gm).astype(np.float32), _literal(zp, gm).astype(np.int64),
                       int(qmin), int(qmax), dtype, int(axis))
    _, scale, zp, qmin, qmax, dtype = args[:6]
    return QParams(np.float32(_literal(scale, gm)), np.int64(_literal(zp, gm)), int(qmin), int(qmax), dtype)


aten = torch.ops.aten
# Ops that only move data: between a dequantize and a quantize they stay integer.
PASSTHROUGH = {
    aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.clone.default, aten.alias.default,
    aten.contiguous.default, aten.permute.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default,
    aten.unsqueeze.default, aten.flatten.using_ints, aten.t.default, operator.getitem,
    aten.slice.Tensor, aten.select.int, aten.cat.default, aten.expand.default,
    aten.repeat.default, aten.flip.default, aten.constant_pad_nd.default, aten.index_select.default,
    aten.gather.default,
}
# Ops whose result is an index, not a quantized number: they run on the integers of dequantized inputs.
INDEX_RESULT_OPS = {aten.argmax.default}


def _float_tensor_inputs(node: Node) -> list[Node]:
    return [a for a in node.all_input_nodes
            if isinstance(a.meta.get("val"), torch.Tensor) and a.meta["val"].dtype.is_floating_point]


def _is_passthrough(node: Node) -> bool:
    return node.op == "call_function" and node.target in PASSTHROUGH


def _sink_ok(node: Node) -> bool:
    """Every use of ``node`` is quantized, possibly after more data movement (looks forward only)."""
    def ok(u: Node) -> bool:
        if is_quantize(u):
            return True
        if u.target is operator.getitem and not u.users:
            return True
        return _is_passthrough(u) and _sink_ok(u)

    return bool(node.users) and all(ok(u) for u in node.users)


def _source_ok(a: Node) -> bool:
    """``a`` holds integers: a dequantize, or data movement of one used only in integer code."""
    if is_dequantize(a):
        return True
    if not (_is_passthrough(a) and _sink_ok(a)):
        return False
    data = a.args[0] if isinstance(a.args[0], (list, tuple)) else [a.args[0]]  # cat reads a list
    return all(isinstance(d, Node) and _source_ok(d) for d in data)


def fused_activation_of(node: Node) -> Node | None:
    """The activation after ``node`` that runs inside it in integer lowering, if any."""
    users = list(node.users)
    if len(users) == 1 and users[0].op == "call_function" and users[0].target in FUSABLE_ACTIVATIONS:
        act = users[0]
        if _sink_ok(act):
            return act
    return None


def _bool_output(node: Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype == torch.bool


def _reads_only_bool(node: Node) -> bool:
    vals = [a.meta.get("val") for a in node.all_input_nodes]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    return bool(tensors) and all(v.dtype == torch.bool for v in tensors)


def is_integer_node(node: Node) -> bool:
    """True when ``node`` computes on integers: float inputs all dequantized, outputs all quantized
    (or bool, as comparisons give; a bool input counts as an integer one)."""
    if node.op != "call_function" or is_quantize(node) or is_dequantize(node):
        return False
    if node.meta.get(INTEGER_KEY):  # already folded by the lowering passes
        return True
    if node.target is operator.getitem:
        return isinstance(node.args[0], Node) and is_integer_node(node.args[0])
    inputs = _float_tensor_inputs(node)
    if inputs and all(_source_ok(a) for a in inputs):
        if _sink_ok(node) or fused_activation_of(node) is not None or _bool_output(node) \
                or node.target in INDEX_RESULT_OPS:
            return True
    if not inputs and _reads_only_bool(node) and _sink_ok(node):  # a mask made a quantized number
        return True
    # an activation fused into the integer op before it
    if node.target in FUSABLE_ACTIVATIONS and len(inputs) == 1:
        producer = inputs[0]
        return fused_activation_of(producer) is node and is_integer_node(producer)
    return False


def integer_dtype(node: Node) -> torch.dtype | None:
    """The integer type a quantized op computes on: that of the dequantize feeding it or the quantize after it."""
    near = [a for a in node.all_input_nodes if is_dequantize(a)] + [u for u in node.users if is_quantize(u)]
    for n in near:
        q = qparams_of(n) if not any(isinstance(a, Node) for a in n.args[1:3]) else None
        if q is not None:
            return q.dtype
    q = node.meta.get("tosakit_q")
    return q.dtype if q is not None else None
