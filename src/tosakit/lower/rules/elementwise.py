"""Elementwise arithmetic and activations: ADD, SUB, MUL, CLAMP, SIGMOID, TANH, EXP."""

from __future__ import annotations

import numpy as np
import torch
from torch.fx import Node

from ..lowering import F32_MAX, Lowering, int_dtype, lowers, quantized_bounds
from ..tosa_graph import DType, Op, Value

aten = torch.ops.aten
ADD_SHIFT = 20  # headroom bits when int8 operands meet in int32


def _out_shape(a: Value, b: Value) -> tuple[int, ...]:
    return tuple(max(x, y) for x, y in zip(a.shape, b.shape))


def _alpha_check(node: Node, spec) -> str | None:
    alpha = node.kwargs.get("alpha", 1)
    return None if alpha == 1 else f"{node.target} with alpha={alpha} has no lowering yet"


def _operands(ctx: Lowering, node: Node) -> tuple[Value, Value]:
    a, b = (ctx.arg(x) if isinstance(x, Node) else None for x in node.args[:2])
    if b is None:  # tensor op scalar
        b = ctx.scalar(float(node.args[1]), a)
    a, b = ctx.same_order(a, b)
    return a, b


def _add_sub(ctx: Lowering, node: Node, op) -> Value:
    a, b = _operands(ctx, node)
    shape = _out_shape(a, b)
    q_out = ctx.q_of(node)
    if q_out is None:
        return ctx.fused_clamp(ctx.emit(op, [a, b], shape, a.dtype, like=a, node=node), node)
    # both operands to int32 on a shared fine scale, add, then one rescale to the output
    common = 2 * max(a.q.s, b.q.s) / (1 << ADD_SHIFT)
    a32 = ctx.rescale(a, a.q.s / common, DType.INT32, a.q.zp, 0)
    b32 = ctx.rescale(b, b.q.s / common, DType.INT32, b.q.zp, 0)
    acc = ctx.emit(op, [a32, b32], shape, DType.INT32, like=a, node=node)
    out = ctx.rescale(acc, common / q_out.s, int_dtype(q_out), 0, q_out.zp, q=q_out, node=node)
    return ctx.fused_clamp(out, node)


@lowers(aten.add.Tensor, check=_alpha_check)
def add(ctx: Lowering, node: Node) -> Value:
    return _add_sub(ctx, node, Op.ADD)


@lowers(aten.sub.Tensor, check=_alpha_check)
def sub(ctx: Lowering, node: Node) -> Value:
    return _add_sub(ctx, node, Op.SUB)


@lowers(aten.mul.Tensor)
def mul(ctx: Lowering, node: Node) -> Value:
    a, b = _operands(ctx, node)
    shape = _out_shape(a, b)
    q_out = ctx.q_of(node)
    if q_out is None:
        shift = ctx.g.const(np.zeros(1, np.int8), DType.INT8)
        return ctx.emit(Op.MUL, [a, b, shift], shape, a.dtype, like=a, node=node)
    a32 = ctx.rescale(a, 1.0, DType.INT32, a.q.zp, 0)
    b32 = ctx.rescale(b, 1.0, DType.INT32, b.q.zp, 0)
    shift = ctx.g.const(np.zeros(1, np.int8), DType.INT8)
    acc = ctx.emit(Op.MUL, [a32, b32, shift], shape, DType.INT32, like=a, node=node)
    return ctx.rescale(acc, a.q.s * b.q.s / q_out.s, int_dtype(q_out), 0, q_out.zp, q=q_out, node=node)


def _clamp_rule(ctx: Lowering, node: Node, lo: float | None, hi: float | None) -> Value:
    x = ctx.arg(node.args[0])
    q_out = ctx.q_of(node)
    if q_out is None:
        return ctx.clamp(x, -F32_MAX if lo is None else lo, F32_MAX if hi is None else hi, node=node)
    if (x.q.s, x.q.zp) != (q_out.s, q_out.zp):
        x = ctx.rescale(x, x.q.s / q_out.s, int_dtype(q_out), x.q.zp, q_out.zp, q=q_out)
    return ctx.clamp(x.with_(q=q_out), *quantized_bounds(q_out, lo, hi), node=node)


@lowers(aten.relu.default)
def relu(ctx: Lowering, node: Node) -> Value:
    return _clamp_rule(ctx, node, 0.0, None)


@lowers(aten.hardtanh.default)
def hardtanh(ctx: Lowering, node: Node) -> Value:
    lo = node.args[1] if len(node.args) > 1 else -1.0
    hi = node.args[2] if len(node.args) > 2 else 1.0
    return _clamp_rule(ctx, node, float(lo), float(hi))


@lowers(aten.clamp.default)
def clamp(ctx: Lowering, node: Node) -> Value:
    lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    return _clamp_rule(ctx, node, None if lo is None else float(lo), None if hi is None else float(hi))


def unary(op, fn):
    """A rule for an elementwise function: the TOSA op in float, a TABLE in int8."""

    def rule(ctx: Lowering, node: Node) -> Value:
        x = ctx.arg(node.args[0])
        q_out = ctx.q_of(node)
        if q_out is not None:
            return ctx.table(x, fn, q_out, node=node)
        return ctx.emit(op, [x], x.shape, x.dtype, like=x, node=node)

    return rule


lowers(aten.sigmoid.default)(unary(Op.SIGMOID, torch.sigmoid))
lowers(aten.tanh.default)(unary(Op.TANH, torch.tanh))
lowers(aten.exp.default)(unary(Op.EXP, torch.exp))
