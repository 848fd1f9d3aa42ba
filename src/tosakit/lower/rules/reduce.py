"""Reductions: REDUCE_SUM (int32 in INT), REDUCE_MAX / REDUCE_MIN (on the integers), REDUCE_ANY / REDUCE_ALL (bool),
ARGMAX (int32), variance, vector norms.

Reduced dims stay in the value's layout as size-1 dims; ``keepdim=False`` then drops them in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch.fx import Node

from ...capture import vector_norm_args
from ...quantize.qdq import integer_dtype
from ..lowering import NAN_PROPAGATE, Lowering, int_dtype, lowers, make_attr
from ..tosa_graph import DType, Op, TosaGraph, Value, identity
from ..transpose import TransposeCase, emit_transpose, transpose_case
from . import pool
from .shape import checks, rank_check, squeeze_dims, unsqueeze_dim

aten = torch.ops.aten
REDUCE_ATTR = {
    Op.REDUCE_SUM: ("ReduceSumAttribute",),
    Op.REDUCE_MAX: ("ReduceMaxAttribute", NAN_PROPAGATE),
    Op.REDUCE_MIN: ("ReduceMinAttribute", NAN_PROPAGATE),
    Op.REDUCE_ANY: ("ReduceAnyAttribute",),
    Op.REDUCE_ALL: ("ReduceAllAttribute",),
}
U55_ARGMAX_CHANNELS = 127  # Vela: an Ethos-U55/U65 ARGMAX runs over at most 127 channels
U55_ARGMAX_POSITIONS = 65536  # ... at up to 65536 positions (W*H)
INT16_SUM_LIMIT = 1 << 16  # int16 values an int32 sum holds whatever they are (2**16 * 32767 < 2**31)
ARGMAX_INPUTS = (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.int16)  # int8/16: quantized


def reduce_dims(node: Node) -> list[int]:
    """The torch dims a reduction's ``dim`` argument names (None or [] : every dim)."""
    rank = node.args[0].meta["val"].dim()
    dims = node.args[1] if len(node.args) > 1 and node.args[1] is not None else []
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted({d % rank for d in dims}) or list(range(rank))


def keepdim(node: Node) -> bool:
    """Whether a reduction keeps its reduced dims (as size 1)."""
    return bool(node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False))


def reduce(ctx: Lowering, v: Value, op, dims, node: Node) -> Value:
    """``op`` (a REDUCE_*) over each torch dim in ``dims``; they stay as size-1 dims, in place."""
    name, *extra = REDUCE_ATTR[op]
    for d in dims:
        axis = v.tosa_dim(d)
        if v.shape[axis] == 1:
            continue
        shape = list(v.shape)
        shape[axis] = 1
        v = ctx.emit(op, [v], shape, v.dtype, like=v, q=v.q, attr=make_attr(name, axis, *extra), node=node)
    return v


def finish(ctx: Lowering, v: Value, dims, node: Node) -> Value:
    """Drop the reduced dims unless the op keeps them."""
    return finish_dims(ctx, v, dims, keepdim(node), node)


def finish_dims(ctx: Lowering, v: Value, dims, keep: bool, node: Node) -> Value:
    """Drop the reduced dims unless ``keep``."""
    return v if keep else squeeze_dims(ctx, v, dims, node)


def scale(ctx: Lowering, v: Value, k: float, node: Node) -> Value:
    """Float ``v * k`` (MUL by a broadcast constant)."""
    shift = ctx.g.const(np.zeros(1, np.int8), DType.INT8)
    return ctx.emit(Op.MUL, [v, ctx.scalar(k, v), shift], v.shape, v.dtype, like=v, node=node)


def _float_check(node: Node, spec) -> str | None:
    if not node.meta["val"].dtype.is_floating_point:
        return f"{node.target} of integer tensors gives int64, which TOSA lacks"
    return None


def _int16_sum_check(node: Node, spec) -> str | None:
    count = math.prod(node.args[0].meta["val"].shape[d] for d in reduce_dims(node))
    if integer_dtype(node) == torch.int16 and count > INT16_SUM_LIMIT:
        return (f"{node.target} adds {count} int16 values, which can overflow its int32 accumulator (at most "
                f"{INT16_SUM_LIMIT}): sum in parts, or quantize it with int8 activations")
    return None


@lowers(aten.sum.dim_IntList, int16=True, check=checks(_float_check, _int16_sum_check))
def sum_(ctx: Lowering, node: Node) -> Value:
    """Integers: REDUCE_SUM in int32 (zero point removed), one RESCALE to the output's quantization."""
    x = ctx.arg(node.args[0])
    dims = reduce_dims(node)
    if x.q is None:
        return finish(ctx, reduce(ctx, x, Op.REDUCE_SUM, dims, node), dims, node)
    q_out = ctx.q_of(node)
    acc = reduce(ctx, ctx.rescale(x, 1.0, DType.INT32, x.q.zp, 0, node=node), Op.REDUCE_SUM, dims, node)
    out = ctx.rescale(acc, x.q.s / q_out.s, int_dtype(q_out), 0, q_out.zp, q=q_out, node=node)
    return finish(ctx, out, dims, node)


@dataclass(frozen=True)
class ReduceCase:
    """A REDUCE_MAX / REDUCE_MIN over the innermost dim of a value stored out of torch order, where torch order
    puts that dim further out (a channels-last activation reduced over its channels: a 1-D CNN's log-softmax).
    The ``torch_order`` form moves the value to torch order first: Vela reduces over an outer axis in a fraction
    of the cycles (wav2letter's [65, 40] int8 over its 40 channels, ethos-u85-256: 13,157 cycles in place,
    about 3.5 k with the move)."""

    op: object
    swap: TransposeCase  # stored order -> torch order
    swap_form: str  # the backend's form of that TRANSPOSE
    axis: int  # the reduced axis in torch order

    @property
    def forms(self) -> tuple[str, ...]:
        return ("in_place", "torch_order")

    def candidate(self, form: str) -> bytes:
        """This reduction alone in ``form``, for a backend to measure."""
        g = TosaGraph()
        x = g.input(self.swap.shape, self.swap.dtype)
        shape, axis = list(self.swap.shape), len(self.swap.shape) - 1
        if form == "torch_order":
            x = emit_transpose(g, x, self.swap, self.swap_form)
            shape, axis = list(self.swap.out_shape), self.axis
        shape[axis] = 1
        name, *extra = REDUCE_ATTR[self.op]
        g.output(g.op(self.op, [x], shape, self.swap.dtype, make_attr(name, axis, *extra)))
        return g.serialize()


def _reduce_case(ctx: Lowering, x: Value, op, dims) -> ReduceCase | None:
    """The choice of where to reduce ``x``, when there is one (see ReduceCase)."""
    if op not in (Op.REDUCE_MAX, Op.REDUCE_MIN) or len(dims) != 1 or x.tosa_dim(dims[0]) != x.rank - 1:
        return None
    d = dims[0]
    if x.shape[-1] == 1 or math.prod(x.shape) == x.shape[-1] or \
            all(s == 1 for s in x.torch_shape[d + 1:]):  # in torch order the dim is innermost too
        return None
    swap = transpose_case(x.shape, [x.order.index(t) for t in range(x.rank)], x.dtype)
    return ReduceCase(op, swap, ctx.form_of(swap), d)


def extreme(op):
    """amax / amin / max / min over dims (REDUCE_MAX or REDUCE_MIN, integers keep their quantization); any / all
    (REDUCE_ANY, REDUCE_ALL). A max or min over the innermost dim of a value stored out of torch order may
    reduce it in torch order (ReduceCase); the value's later users then read that copy too."""

    def rule(ctx: Lowering, node: Node) -> Value:
        dims = reduce_dims(node)
        x = ctx.arg(node.args[0])
        case = _reduce_case(ctx, x, op, dims)
        if case is not None and ctx.form_of(case) == "torch_order":
            x = ctx.values[node.args[0]] = ctx.torch_order(x)
        return finish(ctx, reduce(ctx, x, op, dims, node), dims, node)

    return rule


lowers(aten.amax.default, aten.max.default, int16=True, check=rank_check)(extreme(Op.REDUCE_MAX))
lowers(aten.amin.default, aten.min.default, int16=True, check=rank_check)(extreme(Op.REDUCE_MIN))
lowers(aten.mean.default, check=rank_check)(pool.mean)  # mean.dim's rule, over every dim


def _bool_check(node: Node, spec) -> str | None:
    dtype = node.args[0].meta["val"].dtype
    return None if dtype == torch.bool else f"{node.target} of {dtype} tensors: compare them with 0 first"


# any/all of bool tensors (the guard attention adds for fully masked rows): not in the Ethos-U55/U65 subset
lowers(aten.any.dim, aten.any.dims, u55=False, check=checks(_bool_check))(extreme(Op.REDUCE_ANY))
lowers(aten.all.dim, aten.all.dims, u55=False, check=checks(_bool_check))(extreme(Op.REDUCE_ALL))


# ------------------------------------------------------------------ cumulative sum

CUMSUM_LIMIT = 1 << 22  # elements of the x-times-triangle product a cumulative sum multiplies out


def _cumsum_check(node: Node, spec) -> str | None:
    out = node.meta["val"]
    if not (out.dtype.is_floating_point or out.dtype == torch.int32):
        return f"cumsum giving {out.dtype} (integers sum to int64, which TOSA lacks): pass dtype=torch.int32"
    x = node.args[0].meta["val"]
    n = x.shape[node.args[1] % max(x.dim(), 1)] if x.dim() else 1
    if x.numel() * n > CUMSUM_LIMIT:
        return (f"cumsum over {n} positions multiplies out {x.numel() * n} elements (limit {CUMSUM_LIMIT}): "
                "sum shorter runs")
    return None


@lowers(aten.cumsum.default, int16=True, check=checks(_cumsum_check))
def cumsum(ctx: Lowering, node: Node) -> Value:
    """Position i sums positions 0..i: x as [before, 1, N, after] times a lower-triangular 0/1 constant
    [1, N, N, 1], both broadcast (a TILE of x first cost Ethos-U85 35,840 cycles for 32 positions, 5 times the
    rest of the sum), then REDUCE_SUM over the input positions. Integers add in int32 (zero point removed) and
    are rescaled once, exactly."""
    x = ctx.arg(node.args[0])
    shape = x.torch_shape or (1,)
    dim = node.args[1] % len(shape)
    before, n, after = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    q_out = ctx.q_of(node)
    if x.q is not None:
        v = ctx.rescale(x, 1.0, DType.INT32, x.q.zp, 0, node=node)
    elif node.meta["val"].dtype == torch.int32 and x.dtype != DType.INT32:
        v = ctx.emit(Op.CAST, [x], x.shape, DType.INT32, like=x, node=node)
    else:
        v = x
    v = ctx.reshape(v, (before, 1, n, after), node)
    tri = np.tril(np.ones((n, n))).reshape(1, n, n, 1)
    mask = Value(ctx.g.const(tri, v.dtype), tri.shape, v.dtype, identity(4))
    shift = ctx.g.const(np.zeros(1, np.int8), DType.INT8)
    acc = reduce(ctx, ctx.emit(Op.MUL, [v, mask, shift], (before, n, n, after), v.dtype, like=v, node=node),
                 Op.REDUCE_SUM, [2], node)
    if x.q is not None:
        acc = ctx.rescale(acc, x.q.s / q_out.s, int_dtype(q_out), 0, q_out.zp, q=q_out, node=node)
    return ctx.reshape(acc, node.meta["val"].shape, node)


# ------------------------------------------------------------------ arg-max


def _argmax_extent(node: Node) -> tuple[int, int]:
    """(values compared, positions) of an arg-max."""
    shape = node.args[0].meta["val"].shape
    dim = node.args[1] if len(node.args) > 1 else None
    if dim is None:
        return math.prod(shape), 1
    return shape[dim], math.prod(shape) // max(shape[dim], 1)


def index_result_reason(node: Node, spec) -> str | None:
    """Why an arg-max cannot run on ``spec``. Its int64 indices are int32 inside the delegate; the
    program widens them back on the CPU after it."""
    if node.args[0].meta["val"].dtype not in ARGMAX_INPUTS:
        return f"arg-max of {node.args[0].meta['val'].dtype} tensors has no TOSA lowering"
    channels, positions = _argmax_extent(node)
    if spec.is_u55_subset and (channels > U55_ARGMAX_CHANNELS or positions > U55_ARGMAX_POSITIONS):
        return (f"arg-max over {channels} values at {positions} positions: Ethos-U55/U65 take at most "
                f"{U55_ARGMAX_CHANNELS} values at {U55_ARGMAX_POSITIONS} positions")
    return None


@lowers(aten.argmax.default, check=checks(index_result_reason))
def argmax(ctx: Lowering, node: Node) -> Value:
    """ARGMAX (int32 indices; int8 order is the real order). On Ethos-U55/U65 the reduced dim goes last
    and the rest is flattened: Vela runs arg-max over the channels of a batch-1 feature map."""
    x = ctx.arg(node.args[0])
    every = len(node.args) < 2 or node.args[1] is None
    dim = 1 if every else node.args[1]
    if every:
        x = ctx.reshape(x, (1, math.prod(x.shape)), node)
    dim %= x.rank
    shape = [s for s, d in zip(x.shape, x.order) if d != dim]
    order = [d - (d > dim) for d in x.order if d != dim]
    if ctx.spec.is_u55_subset:
        x = ctx.to_order(x, tuple(d for d in x.order if d != dim) + (dim,))
        x = ctx.relayout(x, (math.prod(shape), x.shape[-1]), identity(2), node)
        axis = 1
    else:
        axis = x.tosa_dim(dim)
    out_shape = [s for i, s in enumerate(x.shape) if i != axis]
    y = ctx.emit(Op.ARGMAX, [x], out_shape, DType.INT32, order=identity(len(out_shape)),
                 attr=make_attr("ArgMaxAttribute", axis, NAN_PROPAGATE), node=node)
    y = ctx.relayout(y, shape, order, node)
    if every:
        return ctx.reshape(y, node.meta["val"].shape, node)
    return unsqueeze_dim(ctx, y, dim, node) if keepdim(node) else y


# ------------------------------------------------------------------ variance (float; the quantizer decomposes it)


def _var_args(node: Node) -> tuple[int, float]:
    """(element count, correction) of ``var.correction``."""
    shape = node.args[0].meta["val"].shape
    correction = node.kwargs.get("correction")
    return math.prod(shape[d] for d in reduce_dims(node)), float(1 if correction is None else correction)


def _var_check(node: Node, spec) -> str | None:
    count, correction = _var_args(node)
    if count - correction <= 0:
        return f"var over {count} elements with correction {correction:g} divides by zero"
    return None


@lowers(aten.var.correction, int=False, u55=False, check=checks(_var_check))
def var(ctx: Lowering, node: Node) -> Value:
    """sum((x - sum(x) / N)^2) / (N - correction), in float (for INT the quantizer decomposes var)."""
    x = ctx.arg(node.args[0])
    dims = reduce_dims(node)
    count, correction = _var_args(node)
    mean = scale(ctx, reduce(ctx, x, Op.REDUCE_SUM, dims, node), 1.0 / count, node)
    dev = ctx.emit(Op.SUB, [x, mean], x.shape, x.dtype, like=x, node=node)
    shift = ctx.g.const(np.zeros(1, np.int8), DType.INT8)
    sq = ctx.emit(Op.MUL, [dev, dev, shift], x.shape, x.dtype, like=x, node=node)
    v = scale(ctx, reduce(ctx, sq, Op.REDUCE_SUM, dims, node), 1.0 / (count - correction), node)
    return finish(ctx, v, dims, node)


# ------------------------------------------------------------------ vector norms (float; the quantizer decomposes them)

NORM_ORDERS = (1.0, 2.0, float("inf"))


def _norm_check(node: Node, spec) -> str | None:
    order = vector_norm_args(node)[1]
    if order not in NORM_ORDERS:
        return (f"{node.target} of order {order} has no lowering (orders 1, 2 and inf do)" if order is not None else
                f"{node.target} with a dtype conversion has no lowering: convert its input first")
    return _float_check(node, spec)


@lowers(aten.linalg_vector_norm.default, int=False, u55=False, check=checks(_norm_check))
def vector_norm(ctx: Lowering, node: Node) -> Value:
    """sqrt(sum(x * x)) (POW 0.5: TOSA has no SQRT), sum(|x|) or max(|x|) over the dims, in float (for INT the
    quantizer decomposes it)."""
    x, order, dims, keep = vector_norm_args(node)
    x = ctx.arg(x)
    if order == 2.0:
        shift = ctx.g.const(np.zeros(1, np.int8), DType.INT8)
        squares = ctx.emit(Op.MUL, [x, x, shift], x.shape, x.dtype, like=x, node=node)
        total = reduce(ctx, squares, Op.REDUCE_SUM, dims, node)
        half = ctx.scalar(0.5, total)
        v = ctx.emit(Op.POW, [total, half], total.shape, total.dtype, like=total, node=node)
    else:
        size = ctx.emit(Op.ABS, [x], x.shape, x.dtype, like=x, node=node)
        v = reduce(ctx, size, Op.REDUCE_SUM if order == 1.0 else Op.REDUCE_MAX, dims, node)
    return finish_dims(ctx, v, dims, keep, node)
