"""Normalization layers in float: layer norm, group norm and inference batch norm.

In INT the quantizer decomposes them into primitives first (each with its own quantization), so
these rules only lower the float ops.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.fx import Node

from ..lowering import Lowering, lowers, make_attr
from ..tosa_graph import DType, Op, Value

aten = torch.ops.aten


def _binary(ctx: Lowering, op, a: Value, b: Value, node: Node | None = None) -> Value:
    """An elementwise float op with broadcasting (MUL gets its shift operand)."""
    a, b = ctx.same_order(a, b)
    shape = tuple(max(x, y) for x, y in zip(a.shape, b.shape))
    extra = [ctx.g.const(np.zeros(1, np.int8), DType.INT8)] if op == Op.MUL else []
    return ctx.emit(op, [a, b, *extra], shape, a.dtype, like=a, node=node)


def _param(ctx: Lowering, t: torch.Tensor, rank: int, dim: int) -> Value:
    """A per-channel float constant laid along torch dim ``dim`` of a rank-``rank`` value."""
    shape = [1] * rank
    shape[dim: dim + t.dim()] = t.shape
    return ctx.const_value(t.float().reshape(shape))


def _mean(ctx: Lowering, v: Value, dims: list[int]) -> Value:
    """Mean over torch dims (kept as size 1): REDUCE_SUM each, then MUL by 1/count."""
    count = 1
    for d in dims:
        axis = v.tosa_dim(d)
        count *= v.shape[axis]
        shape = list(v.shape)
        shape[axis] = 1
        v = ctx.emit(Op.REDUCE_SUM, [v], shape, v.dtype, like=v, attr=make_attr("ReduceSumAttribute", axis))
    return _binary(ctx, Op.MUL, v, ctx.scalar(1.0 / count, v))


def _normalize(ctx: Lowering, x: Value, dims: list[int], eps: float) -> Value:
    """(x - mean) * rsqrt(var + eps) over torch dims ``dims``."""
    dev = _binary(ctx, Op.SUB, x, _mean(ctx, x, dims))
    var = _mean(ctx, _binary(ctx, Op.MUL, dev, dev), dims)
    var = _binary(ctx, Op.ADD, var, ctx.scalar(float(eps), var))
    rstd = ctx.emit(Op.RSQRT, [var], var.shape, var.dtype, like=var)
    return _binary(ctx, Op.MUL, dev, rstd)


def _affine(ctx: Lowering, y: Value, w_node, b_node, dim: int, node: Node) -> Value:
    """y * weight + bias, the parameters laid from torch dim ``dim``."""
    for p, op in ((w_node, Op.MUL), (b_node, Op.ADD)):
        if p is not None:
            y = _binary(ctx, op, y, _param(ctx, ctx.constant(p), y.rank, dim), node=node)
    return y


@lowers(aten.native_layer_norm.default, int=False, u55=False)
def layer_norm(ctx: Lowering, node: Node) -> tuple[Value]:
    x_node, shape, w_node, b_node, eps = node.args
    x = ctx.arg(x_node)
    dims = list(range(x.rank - len(shape), x.rank))
    return (_affine(ctx, _normalize(ctx, x, dims, eps), w_node, b_node, dims[0], node),)


@lowers(aten.native_group_norm.default, int=False, u55=False)
def group_norm(ctx: Lowering, node: Node) -> tuple[Value]:
    """Normalize [N, groups, C/groups * spatial], then the per-channel affine on the input's shape."""
    x_node, w_node, b_node, n, _, _, groups, eps = node.args
    x = ctx.arg(x_node)
    shape = x.torch_shape
    y = _normalize(ctx, ctx.reshape(x, (n, groups, int(np.prod(shape)) // (n * groups))), [2], eps)
    return (_affine(ctx, ctx.reshape(y, shape), w_node, b_node, 1, node),)


@lowers(aten._native_batch_norm_legit_no_training.default, int=False, u55=False)
def batch_norm(ctx: Lowering, node: Node) -> tuple[Value]:
    """Inference batch norm not folded into a convolution: x * scale + shift per channel (dim 1)."""
    x_node, w_node, b_node, mean_node, var_node, _, eps = node.args
    x = ctx.arg(x_node)
    scale = torch.rsqrt(ctx.constant(var_node).double() + eps)
    if w_node is not None:
        scale = scale * ctx.constant(w_node).double()
    shift = -ctx.constant(mean_node).double() * scale
    if b_node is not None:
        shift = shift + ctx.constant(b_node).double()
    y = _binary(ctx, Op.MUL, x, _param(ctx, scale, x.rank, 1))
    return (_binary(ctx, Op.ADD, y, _param(ctx, shift, x.rank, 1), node=node),)
