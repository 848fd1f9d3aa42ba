"""Comparisons, logic and selection: EQUAL, GREATER, GREATER_EQUAL, LOGICAL_*, SELECT.

None of these is in the Ethos-U55/U65 TOSA subset. Quantized comparisons compare
int32 (TOSA compares no narrower integers): both operands on one scale, or a
tensor against a number turned into an exact integer threshold in its own units.
"""

from __future__ import annotations

import math

import torch
from torch.fx import Node

from ..lowering import Lowering, lowers
from ..tosa_graph import DType, Op, Value, is_float
from .elementwise import ADD_SHIFT, ew, to_q

aten = torch.ops.aten
INT32_MAX = 2**31 - 1

# ATen comparison -> (TOSA op, operands swapped, result negated)
COMPARISONS = {
    aten.eq: (Op.EQUAL, False, False),
    aten.ne: (Op.EQUAL, False, True),
    aten.gt: (Op.GREATER, False, False),
    aten.ge: (Op.GREATER_EQUAL, False, False),
    aten.lt: (Op.GREATER, True, False),
    aten.le: (Op.GREATER_EQUAL, True, False),
}


def _common_scale(ctx: Lowering, a: Value, b: Value) -> tuple[Value, Value]:
    """Quantized operands as int32 on one scale: their own when they share it (exact), else a fine one."""
    if a.q is None or b.q is None:
        return a, b
    same = (a.q.s, a.q.zp) == (b.q.s, b.q.zp)
    common = a.q.s if same else 2 * max(a.q.s, b.q.s) / (1 << ADD_SHIFT)
    return tuple(ctx.rescale(v, v.q.s / common, DType.INT32, v.q.zp, 0) for v in (a, b))


def _integer_units(ctx: Lowering, v: Value) -> tuple[Value, float]:
    """``v`` as int32 counts of a real step (quantized: minus the zero point; native ints: step 1)."""
    if v.q is not None:
        return ctx.rescale(v, 1.0, DType.INT32, v.q.zp, 0), v.q.s
    if v.dtype != DType.INT32:
        v = ctx.emit(Op.CAST, [v], v.shape, DType.INT32, like=v)
    return v, 1.0


def _threshold(c: float, step: float, op, swapped: bool) -> int | None:
    """The integer t such that comparing integers n with t answers the real comparison with c;
    None for EQUAL when no integer equals c."""
    r = c / step
    if op == Op.EQUAL:
        return int(r) if r.is_integer() else None
    up = (op == Op.GREATER_EQUAL) != swapped  # n >= r <=> n >= ceil(r);  r > n <=> ceil(r) > n
    t = math.ceil(r) if up else math.floor(r)
    return max(-INT32_MAX - 1, min(INT32_MAX, t))


def _against_number(ctx: Lowering, x: Value, c: float, op, swapped: bool):
    """(tensor, threshold) for comparing with a number; None when the answer is the same everywhere."""
    if is_float(x.dtype):
        return x, c
    n, step = _integer_units(ctx, x)
    t = _threshold(c, step, op, swapped)
    return None if t is None else (n, t)


@lowers(*(getattr(p, o) for p in COMPARISONS for o in ("Tensor", "Scalar")), u55=False)
def compare(ctx: Lowering, node: Node) -> Value:
    """eq/ne/gt/ge/lt/le as EQUAL, GREATER and GREATER_EQUAL (swapped or negated)."""
    op, swapped, negated = COMPARISONS[node.target.overloadpacket]
    x, other = ctx.arg(node.args[0]), node.args[1]
    if isinstance(other, Node):
        pair = _common_scale(ctx, x, ctx.arg(other))
    else:
        pair = _against_number(ctx, x, float(other), op, swapped)
        if pair is None:  # x == c for a c no quantized value takes
            return ctx.const_value(torch.full(tuple(node.meta["val"].shape), negated, dtype=torch.bool))
    a, b = reversed(pair) if swapped else pair
    out = ew(ctx, op, a, b, node=node)
    return ew(ctx, Op.LOGICAL_NOT, out, node=node) if negated else out


def _bool_inputs(node: Node, spec) -> str | None:
    vals = [a.meta.get("val") for a in node.all_input_nodes]
    if any(isinstance(v, torch.Tensor) and v.dtype != torch.bool for v in vals):
        return f"{node.target} on non-bool tensors has no lowering; compare them with 0 first"
    return None


LOGIC = {  # on bool tensors, PyTorch's bitwise ops (mask & mask, ~mask) are the logical ones
    aten.logical_and.default: Op.LOGICAL_AND, aten.bitwise_and.Tensor: Op.LOGICAL_AND,
    aten.logical_or.default: Op.LOGICAL_OR, aten.bitwise_or.Tensor: Op.LOGICAL_OR,
    aten.logical_xor.default: Op.LOGICAL_XOR, aten.bitwise_xor.Tensor: Op.LOGICAL_XOR,
    aten.logical_not.default: Op.LOGICAL_NOT, aten.bitwise_not.default: Op.LOGICAL_NOT,
}


@lowers(*LOGIC, u55=False, check=_bool_inputs)
def logical(ctx: Lowering, node: Node) -> Value:
    """LOGICAL_AND/OR/XOR/NOT on bool tensors."""
    return ew(ctx, LOGIC[node.target], *(ctx.arg(a) for a in node.args), node=node)


@lowers(aten.where.self, u55=False, int16=True)
def where(ctx: Lowering, node: Node) -> Value:
    """SELECT; quantized choices first take the output's quantization."""
    cond, a, b = (ctx.arg(x) for x in node.args[:3])
    q_out = ctx.q_of(node)
    if q_out is not None:
        a, b = to_q(ctx, a, q_out), to_q(ctx, b, q_out)
    return ew(ctx, Op.SELECT, cond, a, b, q=q_out, node=node)
