"""The lowering table and the walk that turns a partition's graph into TOSA.

Each ATen overload has one small rule (``@lowers(...)``) returning the TOSA
value for its node, and an ``OpSupport`` record next to it: which profiles it
lowers in and what limits apply. The partitioner reads the same records.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch
import tosa_serializer as ts
from torch.fx import GraphModule, Node

from ..capture import graph_attr, source_of
from ..errors import TosakitError, UnsupportedOpError
from ..partition.partitioner import BOUNDARY_DQ, BOUNDARY_IDS, BOUNDARY_Q, IDS_CAST
from ..quantize.qdq import INDEX_RESULT_OPS, QParams, integer_dtype, is_dequantize, is_integer_node, is_quantize
from ..specs import TosaSpecification
from .tosa_graph import (NHWC, TORCH_TO_TOSA, DType, EmittedOp, Op, TosaGraph, Value, count_ops, identity,
                         make_attr, storage_order)
from .transpose import Case, ChooseForm, emit_transpose, transpose_case
from .views import regrouped, view_groups, view_order

Check = Callable[[Node, TosaSpecification], "str | None"]


@dataclass(frozen=True)
class OpSupport:
    """Where a rule applies: profiles, the U55 subset, and extra limits (a refusal reason or None)."""

    int: bool = True
    fp: bool = True
    u55: bool = True
    int16: bool = False  # lowers int16 activations (a16w8) too
    check: Check | None = None
    note: str = ""


@dataclass(frozen=True)
class Rule:
    target: object
    lower: Callable[["Lowering", Node], Value]
    support: OpSupport


RULES: dict[object, Rule] = {}


def lowers(*targets, **support):
    """Register a lowering rule (and its support record) for ATen overloads."""

    def register(fn):
        for t in targets:
            RULES[t] = Rule(t, fn, OpSupport(**support))
        return fn

    return register


def describe(node: Node) -> str:
    """'aten.convolution.default (node conv2d_3, model.py:41)'."""
    where = source_of(node)
    return f"{node.target} (node {node.name}{', ' + where if where else ''})"


def folds_to_integer(node: Node) -> bool:
    """An op between dequantize and quantize that has an integer rule: it runs on the integers.
    Without one (a float-only rule) it runs in float, its quantize/dequantize explicit."""
    rule = RULES.get(node.target)
    if node.target is operator.getitem:
        return isinstance(node.args[0], Node) and folds_to_integer(node.args[0])
    return is_integer_node(node) and (rule is None or rule.support.int)


def computes_in_float(node: Node) -> bool:
    """True when any tensor ``node`` reads or writes is floating point."""
    vals = [a.meta.get("val") for a in node.all_input_nodes]
    out = node.meta.get("val")
    vals += list(out) if isinstance(out, (tuple, list)) else [out]
    return any(isinstance(v, torch.Tensor) and v.dtype.is_floating_point for v in vals)


def computes_on_bool(node: Node) -> bool:
    """True when every tensor ``node`` reads and writes is bool (logic: in every TOSA profile)."""
    vals = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    tensors = [v for v in vals if isinstance(v, torch.Tensor)]
    return bool(tensors) and all(v.dtype == torch.bool for v in tensors)


def _profile_reason(node: Node, spec: TosaSpecification, s: OpSupport) -> str | None:
    """Why ``spec``'s profiles (INT, FP) cannot run ``node`` as it computes (None when they can)."""
    native_int = not computes_in_float(node)
    integer = native_int or folds_to_integer(node)
    if is_integer_node(node) and not integer and not spec.support_float():
        return f"{node.target} has no integer (INT) lowering yet"
    if integer and not spec.support_integer():
        return f"{node.target} computes on integers but {spec} has no integer profile"
    if native_int and not s.int:
        return f"{node.target} has no integer (INT) lowering yet"
    if not integer:
        if not spec.support_float():
            if _quantized_graph(node.graph):
                return (f"{node.target} computes in float: the quantizer has no rule for it and left it unquantized, "
                        f"and {spec} runs integers only")
            return f"{node.target} computes in float and {spec} runs integers only: quantize the model"
        if not s.fp:
            return f"{node.target} has no float (FP) lowering"
    return None


def _quantized_graph(graph: torch.fx.Graph) -> bool:
    """Whether the graph holds a quantize op (its model was quantized), asked once per graph."""
    if not hasattr(graph, "_tosakit_quantized"):
        graph._tosakit_quantized = any(is_quantize(n) for n in graph.nodes)
    return graph._tosakit_quantized


def _int64_reason(node: Node) -> str | None:
    """TOSA has no int64: only arg-max indices (int32 inside the delegate, widened after it) pass."""
    def int64(n) -> bool:
        val = n.meta.get("val")
        return isinstance(val, torch.Tensor) and val.dtype == torch.int64

    src = next((a for a in node.all_input_nodes
                if int64(a) and a.target not in INDEX_RESULT_OPS and a.op != "get_attr"), None)  # constants narrow
    if src is not None:
        return f"{node.target} reads int64 tensor {src.name}, and TOSA has no int64 (use int32)"
    if int64(node) and node.target not in INDEX_RESULT_OPS and not any(map(int64, node.all_input_nodes)):
        fix = " (pass dtype=torch.int32)" if "dtype" in str(getattr(node.target, "_schema", "")) else ""
        return f"{node.target} produces int64, and TOSA has no int64{fix}"
    return None


def support_reason(node: Node, spec: TosaSpecification) -> str | None:
    """Why ``node`` cannot be lowered for ``spec`` (None when it can)."""
    if node.op != "call_function":
        return None
    if node.target is operator.getitem:
        return None
    if is_quantize(node) or is_dequantize(node):
        if not spec.support_integer():
            return f"{spec} has no integer profile for {node.target}"
        folds = (all(folds_to_integer(u) for u in node.users) if is_dequantize(node)
                 else folds_to_integer(node.args[0]))
        if folds:
            return None  # absorbed into the integer op next to it
        if not spec.support_float():
            return BOUNDARY_Q if is_quantize(node) else BOUNDARY_DQ
    if node.meta.get(IDS_CAST):
        return BOUNDARY_IDS
    rule = RULES.get(node.target)
    if rule is None:
        return f"no TOSA lowering for {node.target}"
    s = rule.support
    why = _int64_reason(node) or (None if computes_on_bool(node) else _profile_reason(node, spec, s))
    if why:
        return why
    if spec.is_u55_subset and not s.u55:
        return f"{node.target} is outside the Ethos-U55/U65 TOSA subset{': ' + s.note if s.note else ''}"
    if not s.int16 and integer_dtype(node) == torch.int16:
        return f"{node.target} has no int16 (a16w8) lowering yet: quantize it with int8 activations"
    return s.check(node, spec) if s.check else None


class Lowering:
    """State while lowering one graph: the TOSA builder and the value of every node."""

    def __init__(self, gm: GraphModule, spec: TosaSpecification, choose: ChooseForm | None = None):
        self.gm = gm
        self.spec = spec
        self.choose = choose  # the backend's pick among equivalent forms (None: each case's first form)
        self.g = TosaGraph()
        self.values: dict[Node, Value] = {}
        self.current: Node | None = None  # the node being lowered

    # ---------------------------------------------------------------- values

    def constant(self, node: Node) -> torch.Tensor:
        """The tensor behind a ``get_attr`` node."""
        return graph_attr(self.gm, node).detach()

    def arg(self, a) -> Value:
        """The TOSA value of an fx argument (constants are materialized on first use)."""
        if a in self.values:
            return self.values[a]
        if isinstance(a, Node) and a.op == "get_attr":
            t = self.constant(a)
            q = a.meta.get("tosakit_q")
            v = self.const_value(t, q)
            self.values[a] = v
            return v
        raise TosakitError(f"internal: {a} has no TOSA value yet")

    def const_value(self, t: torch.Tensor, q: QParams | None = None) -> Value:
        if t.dtype == torch.int64:  # TOSA has no int64: index constants are held as int32
            t = narrow_int64(t)
        dtype = tosa_dtype(t.dtype)
        arr = t.contiguous().numpy()
        if arr.ndim == 0:
            arr = arr.reshape(1)
        return Value(self.g.const(arr, dtype), arr.shape, dtype, identity(arr.ndim), q)

    def scalar(self, x: float, like: Value) -> Value:
        """A rank-matched constant broadcastable against ``like``."""
        arr = np.full([1] * like.rank, x)
        return Value(self.g.const(arr, like.dtype), arr.shape, like.dtype, like.order)

    def emit(self, op, inputs: list, shape, dtype, like: Value | None = None, order=None,
             q: QParams | None = None, attr=None, node: Node | None = None) -> Value:
        """Add a TOSA op and wrap its output as a Value."""
        if op in WINDOW_PADS and attr is not None and min(attr.args[WINDOW_PADS[op]]) < 0:
            inputs, attr = self._crop_for_negative_padding(op, inputs, attr)
        names = [i.name if isinstance(i, Value) else i for i in inputs]
        node = node if node is not None else self.current  # every op records the PyTorch node it lowers
        name = self.g.op(op, names, shape, dtype, attr, location=node.name if node is not None else None)
        order = order if order is not None else (like.order if like is not None else identity(len(shape)))
        return Value(name, tuple(shape), dtype, tuple(order), q)

    def _crop_for_negative_padding(self, op, inputs: list, attr):
        """TOSA has no negative padding: the rows and columns torch's window never reaches (which
        ``tosa_pads`` marks with a negative far pad) are sliced off the NHWC input instead."""
        x = inputs[0]
        index = WINDOW_PADS[op]
        top, bottom, left, right = attr.args[index]
        size = list(x.shape)
        size[1] -= max(-bottom, 0)
        size[2] -= max(-right, 0)
        cropped = self.slice(x, [0] * x.rank, size)
        args = list(attr.args)
        args[index] = [top, max(bottom, 0), left, max(right, 0)]
        return [cropped, *inputs[1:]], make_attr(attr.kind, *args)

    def slice(self, v: Value, start, size) -> Value:
        """SLICE in TOSA dims."""
        return self.emit(Op.SLICE, [v, self.g.shape_const(start), self.g.shape_const(size)], size, v.dtype,
                         like=v, q=v.q, attr=make_attr("SliceAttribute"))

    # ---------------------------------------------------------------- layout

    def to_order(self, v: Value, order: tuple[int, ...]) -> Value:
        """``v`` stored with TOSA dims in ``order`` (a TRANSPOSE when it differs)."""
        order = tuple(order)
        if v.order == order:
            return v
        perms = [v.order.index(d) for d in order]
        shape = [v.shape[p] for p in perms]
        if _big_dims(v.order, v.torch_shape) == _big_dims(order, v.torch_shape):
            return self.relayout(v, shape, order)  # only size-1 dims move: same bytes, new shape
        case = transpose_case(v.shape, perms, v.dtype)
        form = self.form_of(case)
        location = self.current.name if self.current is not None else None
        return Value(emit_transpose(self.g, v.name, case, form, location), tuple(shape), v.dtype, order, v.q)

    def form_of(self, case: Case) -> str:
        """The form to emit ``case`` in: the backend's pick, or the case's first (plain) form."""
        return self.choose(case) if self.choose is not None and len(case.forms) > 1 else case.forms[0]

    def nhwc(self, v: Value) -> Value:
        return self.to_order(v, NHWC) if v.rank == 4 else v

    def torch_order(self, v: Value) -> Value:
        return self.to_order(v, identity(v.rank))

    def reshape(self, v: Value, torch_shape, node: Node | None = None) -> Value:
        """RESHAPE to a torch shape; data must be in torch order unless only size-1 dims moved."""
        torch_shape = tuple(int(s) for s in torch_shape)
        if not order_is_trivial(v):
            v = self.torch_order(v)
        return self.relayout(v, torch_shape, identity(len(torch_shape)), node)

    def relayout(self, v: Value, shape, order, node: Node | None = None) -> Value:
        """RESHAPE to a TOSA ``shape`` whose dims hold torch dims ``order`` (same bytes, new labels)."""
        shape, order = tuple(int(s) for s in shape), tuple(order)
        if shape == v.shape:
            return v.with_(order=order)
        return self.emit(Op.RESHAPE, [v, self.g.shape_const(shape)], shape, v.dtype, order=order, q=v.q,
                         attr=make_attr("ReshapeAttribute"), node=node)

    def view(self, v: Value, torch_shape, node: Node | None = None) -> Value:
        """A torch view: when it only adds or drops size-1 dims, a relabelling that keeps ``v``'s layout
        (channels last stays channels last, so conv1d's and linear's views cost no TRANSPOSE); when it splits or
        merges dims, the same where each merged run is stored together, else after the least reordering that
        makes it so (``views``). The result may be in any order, unlike ``reshape``'s."""
        torch_shape = tuple(int(s) for s in torch_shape)
        old_big = [d for d in range(v.rank) if v.torch_shape[d] != 1]
        new_big = [d for d, s in enumerate(torch_shape) if s != 1]
        if [v.torch_shape[d] for d in old_big] != [torch_shape[d] for d in new_big]:
            groups = view_groups(v.torch_shape, torch_shape) if not order_is_trivial(v) else None
            if groups is None:
                return self.reshape(v, torch_shape, node)
            stored = _big_dims(v.order, v.torch_shape)
            target = regrouped(stored, groups)
            if target != stored:
                v = self.to_order(v, tuple(d for d in v.order if v.torch_shape[d] == 1) + tuple(target))
            order = view_order(target, groups, torch_shape)
            return self.relayout(v, [torch_shape[d] for d in order], order, node)
        to_new = dict(zip(old_big, new_big))
        stored = [to_new[d] for d in v.order if d in to_new]  # big dims in storage order, renumbered
        rank = len(torch_shape)
        # NHWC only for a feature map with channels: [1, 1, N, M] (one head's attention scores) keeps M innermost,
        # where the NPU runs elementwise ops over it, not a depth of 1 (4x the cycles)
        candidates = ([NHWC] if rank == 4 and torch_shape[1] != 1 else []) + [identity(rank)]
        order = next((c for c in candidates if _big_dims(c, torch_shape) == stored),
                     tuple(d for d in range(rank) if torch_shape[d] == 1) + tuple(stored))
        return self.relayout(v, [torch_shape[d] for d in order], order, node)

    def same_order(self, *vals: Value) -> list[Value]:
        """Bring operands of an elementwise op to one layout: NHWC when a full-size operand has it (a CNN's
        residual), else torch order when a full-size operand has it (a sequence model's residual around a block
        that transposed inside), else the first non-trivial one. Broadcast operands never decide."""
        shape = tuple(max(s) for s in zip(*(v.torch_shape for v in vals if v.rank == vals[0].rank)))
        full = [v for v in vals if v.torch_shape == shape]
        plain = identity(len(shape))
        if not any(len(shape) == 4 and _big_dims(v.order, shape) == _big_dims(NHWC, shape) for v in full) and \
                any(_big_dims(v.order, shape) == _big_dims(plain, shape) for v in full):
            target = plain
        else:
            target = next((v.order for v in vals if v.rank == vals[0].rank and v.order != identity(v.rank)),
                          vals[0].order)
        out = []
        for v in vals:
            if v.rank < len(target):  # broadcast operand of lower rank: lift to full rank first
                v = self.reshape(v, (1,) * (len(target) - v.rank) + v.torch_shape)
            out.append(self.to_order(v, target))
        return out

    # ---------------------------------------------------------------- integer helpers

    def rescale(self, v: Value, scale, out_dtype, in_zp: int = 0, out_zp: int = 0, q: QParams | None = None,
                node: Node | None = None) -> Value:
        """RESCALE ``v`` by a real ``scale`` (a float, or one per channel along the last TOSA dim)."""
        node = node if node is not None else self.current
        name = self.g.rescale(v.name, scale, out_dtype, in_zp, out_zp, node.name if node is not None else None)
        return Value(name, v.shape, out_dtype, v.order, q)

    def clamp(self, v: Value, lo, hi, node: Node | None = None) -> Value:
        if is_float_dtype(v.dtype):
            lo_b = np.array([lo], dtype=np.float32).tobytes()
            hi_b = np.array([hi], dtype=np.float32).tobytes()
        else:
            np_t = {DType.INT8: np.int8, DType.INT16: np.int16, DType.INT32: np.int32}[v.dtype]
            lo_b = np.array([lo], dtype=np_t).tobytes()
            hi_b = np.array([hi], dtype=np_t).tobytes()
        attr = make_attr("ClampAttribute", list(lo_b), list(hi_b), NAN_PROPAGATE)
        return self.emit(Op.CLAMP, [v], v.shape, v.dtype, like=v, q=v.q, attr=attr, node=node)

    def table(self, v: Value, fn, q_out: QParams, node: Node | None = None) -> Value:
        """TABLE: ``fn`` (real -> real, on float64 tensors) from v's quantization to ``q_out``'s. int8: 256
        entries, one per input. int16: ``table16``."""
        q_in = v.q
        if q_in is not None and q_in.dtype == q_out.dtype == torch.int16:
            return self.table16(v, fn, q_out, node)
        if q_in is None or q_in.dtype != torch.int8 or q_out.dtype != torch.int8:
            raise TosakitError(f"TABLE lowering needs int8 or int16 input and output of one type (node "
                               f"{node.name if node else '?'})", "quantize its input and output alike")
        real = (torch.arange(-128, 128, dtype=torch.float64) - q_in.zp) * q_in.s
        values = fn(real).to(torch.float64)
        levels = torch.clamp(torch.round(values / q_out.s) + q_out.zp, q_out.qmin, q_out.qmax)
        table = self.g.const(levels.to(torch.int8).numpy(), DType.INT8)
        return self.emit(Op.TABLE, [v, table], v.shape, DType.INT8, like=v, q=q_out,
                         attr=make_attr("TableAttribute"), node=node)

    def table16(self, v: Value, fn, q_out: QParams, node: Node | None = None) -> Value:
        """TOSA's int16 TABLE, then a RESCALE by 1/128 to ``q_out``: 513 entries for the inputs -32768 + 128 i (the
        last one past the int16 range); an input interpolates linearly between the two entries around it, into an
        int32 with 7 fractional bits. Entry i is ``fn`` there in ``q_out``'s steps, less half of what the straight
        line from it to the next entry overshoots ``fn`` at their middle (the line then sits in the middle of the
        curve it replaces), rounded. Where ``fn`` bends within 128 inputs the result may differ from the
        fake-quantized model's by more than one step (exp; a pole: see ``_steps_within_int16``)."""
        q_in = v.q
        real = (torch.arange(-32768, 32769, 64, dtype=torch.float64) - q_in.zp) * q_in.s
        steps = torch.clamp(fn(real).to(torch.float64) / q_out.s, q_out.qmin - q_out.zp, q_out.qmax - q_out.zp)
        at, middle = steps[::2], steps[1::2]
        excess = torch.cat([(at[:-1] + at[1:]) / 2 - middle, torch.zeros(1, dtype=torch.float64)])
        levels = torch.clamp(torch.round(at - excess / 2), q_out.qmin - q_out.zp, q_out.qmax - q_out.zp)
        table = self.g.const(_steps_within_int16(levels.to(torch.int16).numpy()), DType.INT16)
        fixed = self.emit(Op.TABLE, [v, table], v.shape, DType.INT32, like=v, attr=make_attr("TableAttribute"),
                          node=node)
        return self.rescale(fixed, 1 / 128, DType.INT16, 0, q_out.zp, q=q_out, node=node)

    def q_of(self, node: Node) -> QParams | None:
        return node.meta.get("tosakit_q")

    def requantize(self, v, node: Node):
        """Give ``v`` the quantization recorded for ``node`` (a RESCALE when a rule kept another one)."""
        q = self.q_of(node)
        if not isinstance(v, Value) or q is None:
            return v
        if v.q is None:
            return v.with_(q=q)
        if (v.q.s, v.q.zp, v.q.dtype) == (q.s, q.zp, q.dtype):
            return v
        return self.rescale(v, v.q.s / q.s, int_dtype(q), v.q.zp, q.zp, q=q, node=node)

    def fused_clamp(self, v: Value, node: Node) -> Value:
        """Apply an activation fused into ``node`` (meta 'tosakit_clamp', real units)."""
        bounds = node.meta.get("tosakit_clamp")
        if bounds is None:
            return v
        lo, hi = bounds
        if v.q is None:
            return self.clamp(v, -F32_MAX if lo is None else lo, F32_MAX if hi is None else hi, node=node)
        qlo, qhi = quantized_bounds(v.q, lo, hi)
        info = torch.iinfo(v.q.dtype)
        if qlo <= info.min and qhi >= info.max:  # a ReLU whose range starts at 0: the RESCALE already saturates
            return v
        return self.clamp(v, qlo, qhi, node=node)


F32_MAX = 3.4028234663852886e38


def _steps_within_int16(levels: np.ndarray) -> np.ndarray:
    """int16 TABLE entries each within int16 of the one before (moved toward it when not): TOSA requires each step
    between neighbours to fit int16 (the reference model calls a larger one unpredictable), as Ethos-U's LUT holds
    it in 16 bits. Only a jump across a pole needs it (reciprocal from -32767 below 0 to 32767 at 0), where no
    interpolation follows the function anyway."""
    out = levels.astype(np.int64)
    for i in range(1, out.size):
        out[i] = min(max(out[i], out[i - 1] - 32768), out[i - 1] + 32767)
    return out.astype(np.int16)


def is_constant(a) -> bool:
    """A constant tensor, possibly behind a dequantize (before folding)."""
    if is_dequantize(a):
        a = a.args[0]
    return isinstance(a, Node) and a.op == "get_attr"


def quantized_bounds(q: QParams, lo: float | None, hi: float | None) -> tuple[int, int]:
    """Real clamp bounds as integers of ``q`` (exactly what quantizing a clamped float gives)."""
    qlo = q.qmin if lo is None else max(q.qmin, int(round(lo / q.s)) + q.zp)
    qhi = q.qmax if hi is None else min(q.qmax, int(round(hi / q.s)) + q.zp)
    return qlo, qhi


# TOSA ops with a sliding window, and where their [top, bottom, left, right] padding sits in the attribute.
WINDOW_PADS = {Op.CONV2D: 0, Op.DEPTHWISE_CONV2D: 0, Op.AVG_POOL2D: 2, Op.MAX_POOL2D: 2}


def tosa_pads(sizes, kernel, stride, pad, dilation=(1, 1)) -> list[int]:
    """[top, bottom, left, right] for TOSA, whose output size must divide exactly: the far
    padding shrinks by the rows torch's window never reaches; when it goes negative, ``emit``
    slices those rows off the input."""
    out = []
    for size, k, s, p, d in zip(sizes, kernel, stride, pad, dilation):
        span = size - 1 + 2 * p - (k - 1) * d
        out += [p, p - span % s]
    return out


NAN_PROPAGATE = ts.NanPropagationMode.PROPAGATE


def int_dtype(q: QParams):
    """The TOSA integer type of a quantized tensor."""
    return {torch.int8: DType.INT8, torch.int16: DType.INT16, torch.int32: DType.INT32}[q.dtype]


def accumulator(x: Value):
    """The accumulator of a convolution or matmul over ``x``: int32 for int8, int48 for int16, else float."""
    return {DType.INT8: DType.INT32, DType.INT16: DType.INT48}.get(x.dtype, x.dtype)


def tosa_dtype(dtype: torch.dtype):
    try:
        return TORCH_TO_TOSA[dtype]
    except KeyError:
        raise TosakitError(f"dtype {dtype} has no TOSA equivalent", "use float32, int8, int16 or int32 tensors") from None


def narrow_int64(t: torch.Tensor) -> torch.Tensor:
    """An int64 tensor as int32 (TOSA has no int64); its values must fit."""
    info = torch.iinfo(torch.int32)
    if t.numel() and (int(t.min()) < info.min or int(t.max()) > info.max):
        raise TosakitError("an int64 constant has values outside int32, and TOSA has no int64",
                           "keep index and integer constants within int32")
    return t.to(torch.int32)


def is_float_dtype(dtype) -> bool:
    return dtype in (DType.FP32, DType.FP16, DType.BF16)


def _big_dims(order, torch_shape) -> list[int]:
    """The torch dims larger than 1, in the storage ``order``: two layouts with the same list hold the
    same bytes."""
    return [d for d in order if torch_shape[d] != 1]


def order_is_trivial(v: Value) -> bool:
    """True when the layout differs from torch order only by where size-1 dims sit."""
    big = _big_dims(v.order, v.torch_shape)
    return big == sorted(big)


@dataclass
class LoweredGraph:
    """A partition lowered to TOSA: the flatbuffer and what its I/O stands for.

    With probes, every op's result is an extra output after the real ones, named in ``probes``.
    """

    tosa: bytes
    inputs: list[Value]
    outputs: list[Value]
    ops: list[EmittedOp]
    probes: list[tuple[str, Value]] = field(default_factory=list)

    @property
    def op_count(self) -> dict[str, int]:
        return count_ops(self.ops)


def lower_graph(gm: GraphModule, spec: TosaSpecification, probes: bool = False,
                choose: ChooseForm | None = None) -> LoweredGraph:
    """Lower a (pass-prepared) partition graph to one TOSA basic block."""
    ctx = Lowering(gm, spec, choose)
    inputs = []
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta["val"]
            q = node.meta.get("tosakit_q")
            dtype = tosa_dtype(q.dtype if q is not None else val.dtype)
            order = storage_order(val)  # a channels-last input arrives NHWC: no TRANSPOSE at the boundary
            shape = tuple(val.shape[d] for d in order)
            v = Value(ctx.g.input(shape, dtype), shape, dtype, order, q)
            ctx.values[node] = v
            inputs.append(v)
        elif node.op == "call_function":
            if node.target is operator.getitem:
                ctx.values[node] = ctx.values[node.args[0]][node.args[1]]
                continue
            reason = support_reason(node, spec)
            if reason is not None:
                raise UnsupportedOpError(f"cannot lower {describe(node)} for {spec}: {reason}",
                                         "leave it to the CPU (partitioner) or file an issue with the model")
            ctx.current = node
            try:
                ctx.values[node] = ctx.requantize(RULES[node.target].lower(ctx, node), node)
            except (TosakitError, MemoryError):
                raise
            except Exception as exc:  # a rule's own fault: name the node rather than show a deep traceback
                raise TosakitError(f"internal error lowering {describe(node)} for {spec}: {type(exc).__name__}: "
                                   f"{exc}", "please report it with the model; meanwhile compile without "
                                   "--delegate, or rewrite that line") from exc
    ctx.current = None
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    used = {i.name for i in inputs}
    outputs = [_mark_output(ctx, ctx.arg(a), used, storage_order(a.meta["val"]), a) for a in out_node.args[0]]
    ops = ctx.g.needed()
    probed = []
    if probes:
        for node, v in list(ctx.values.items()):
            if node.op == "call_function" and isinstance(v, Value) and node.target is not operator.getitem:
                probed.append((node.name, _mark_output(ctx, v, used, identity(v.rank))))
    ctx.g.prune()
    return LoweredGraph(ctx.g.serialize(), inputs, outputs, ops, probed)


def _mark_output(ctx: Lowering, v: Value, used: set[str], order: tuple[int, ...], node: Node | None = None) -> Value:
    """Make ``v``, stored in ``order``, a graph output; a constant, or a tensor already used as I/O, gets an
    IDENTITY copy (placed at ``node``, the graph node giving the output)."""
    v = ctx.to_order(v, order)
    if v.name in used or ctx.g.info[v.name].data is not None:
        v = ctx.emit(Op.IDENTITY, [v], v.shape, v.dtype, like=v, q=v.q, node=node if isinstance(node, Node) else None)
    used.add(v.name)
    ctx.g.output(v.name)
    return v
