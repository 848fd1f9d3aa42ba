"""Pooling and reductions: AVG_POOL2D, MAX_POOL2D, REDUCE_SUM/REDUCE_MAX, softmax."""

from __future__ import annotations

import numpy as np
import torch
from torch.fx import Node

from ..lowering import NAN_PROPAGATE, Lowering, int_dtype, lowers, make_attr, tosa_pads
from ..tosa_graph import NHWC, DType, Op, Value

aten = torch.ops.aten


def _dims(node: Node) -> list[int]:
    rank = node.args[0].meta["val"].dim()
    dims = node.args[1] if len(node.args) > 1 and node.args[1] is not None else list(range(rank))
    return sorted(d % rank for d in ([dims] if isinstance(dims, int) else dims))


def _is_spatial_mean(node: Node) -> bool:
    return node.args[0].meta["val"].dim() == 4 and _dims(node) == [2, 3]


def _avg_pool(ctx: Lowering, node: Node, x: Value, kernel, stride, pads, out_nchw) -> Value:
    """AVG_POOL2D in NHWC; integers keep their scale (the quantizer shares it), else RESCALE."""
    x = ctx.nhwc(x)
    integer = x.q is not None
    acc = DType.INT32 if integer else DType.FP32
    zp = x.q.zp if integer else 0
    zps = [ctx.g.zero_point(zp, x.dtype), ctx.g.zero_point(zp, x.dtype)]
    attr = make_attr("AvgPool2dAttribute", list(kernel), list(stride), list(pads), acc)
    shape = (out_nchw[0], out_nchw[2], out_nchw[3], out_nchw[1])
    y = ctx.emit(Op.AVG_POOL2D, [x, *zps], shape, x.dtype, order=NHWC, q=x.q, attr=attr, node=node)
    q_out = ctx.q_of(node)
    if integer and (q_out.s, q_out.zp) != (x.q.s, x.q.zp):
        y = ctx.rescale(y, x.q.s / q_out.s, int_dtype(q_out), x.q.zp, q_out.zp, q=q_out, node=node)
    return y


@lowers(aten.mean.dim)
def mean(ctx: Lowering, node: Node) -> Value:
    x = ctx.arg(node.args[0])
    out = tuple(node.meta["val"].shape)
    if _is_spatial_mean(node):  # global average pooling
        n, c, h, w = x.torch_shape
        y = _avg_pool(ctx, node, x, (h, w), (1, 1), (0, 0, 0, 0), (n, c, 1, 1))
        return ctx.reshape(y, out, node=node) if len(out) != 4 else y
    return _mean_by_sum(ctx, node, x, out)


def _mean_by_sum(ctx: Lowering, node: Node, x: Value, out) -> Value:
    """REDUCE_SUM over each dim, then scale by 1/count (in int32 for integers)."""
    dims = _dims(node)
    count = int(np.prod([x.torch_shape[d] for d in dims]))
    q_out = ctx.q_of(node)
    v = ctx.rescale(x, 1.0, DType.INT32, x.q.zp, 0) if x.q is not None else x
    shape = list(v.shape)
    for d in dims:
        axis = v.tosa_dim(d)
        shape[axis] = 1
        v = ctx.emit(Op.REDUCE_SUM, [v], shape, v.dtype, like=v, attr=make_attr("ReduceSumAttribute", axis))
    if x.q is not None:
        v = ctx.rescale(v, x.q.s / count / q_out.s, int_dtype(q_out), 0, q_out.zp, q=q_out, node=node)
    else:
        shift = ctx.g.const(np.zeros(1, np.int8), DType.INT8)
        v = ctx.emit(Op.MUL, [v, ctx.scalar(1.0 / count, v), shift], v.shape, v.dtype, like=v, node=node)
    return ctx.reshape(v, out, node=node)


def _avg_pool_check(node: Node, spec) -> str | None:
    args = list(node.args) + [None] * 7
    padding, ceil_mode, count_include_pad, divisor = args[3], args[4], args[5], args[6]
    if ceil_mode:
        return "avg_pool2d with ceil_mode=True has no lowering yet"
    if divisor is not None:
        return "avg_pool2d with divisor_override has no lowering yet"
    if padding and any(padding) and count_include_pad is not False:
        return "avg_pool2d with padding counts the padding (count_include_pad=True); TOSA does not"
    return None


@lowers(aten.avg_pool2d.default, check=_avg_pool_check)
def avg_pool2d(ctx: Lowering, node: Node) -> Value:
    args = list(node.args) + [None] * 7
    kernel = list(args[1])
    stride = list(args[2] or kernel)
    pad = list(args[3] or [0, 0])
    out = tuple(node.meta["val"].shape)
    x = ctx.arg(args[0])
    pads = tosa_pads(x.torch_shape[2:], kernel, stride, pad)
    return _avg_pool(ctx, node, x, kernel, stride, pads, out)


def _max_pool_check(node: Node, spec) -> str | None:
    args = list(node.args) + [None] * 6
    dilation, ceil_mode = args[4], args[5]
    if dilation and any(d != 1 for d in dilation):
        return "max_pool2d with dilation has no lowering yet"
    if ceil_mode:
        return "max_pool2d with ceil_mode=True has no lowering yet"
    if any(u.args[1] != 0 for u in node.users):
        return "max_pool2d indices are used; only the values can be lowered"
    return None


@lowers(aten.max_pool2d_with_indices.default, check=_max_pool_check)
def max_pool2d(ctx: Lowering, node: Node) -> tuple[Value]:
    args = list(node.args) + [None] * 6
    kernel = list(args[1])
    stride = list(args[2] or kernel)
    pad = list(args[3] or [0, 0])
    x = ctx.nhwc(ctx.arg(args[0]))
    pads = tosa_pads(x.shape[1:3], kernel, stride, pad)
    n, c, oh, ow = node.meta["val"][0].shape
    attr = make_attr("MaxPool2dAttribute", kernel, stride, pads, NAN_PROPAGATE)
    y = ctx.emit(Op.MAX_POOL2D, [x], (n, oh, ow, c), x.dtype, order=NHWC, q=x.q, attr=attr, node=node)
    return (y,)


@lowers(aten._softmax.default, int=False, u55=False)
def softmax(ctx: Lowering, node: Node) -> Value:
    """exp(x - max) / sum(exp(x - max)) along one axis (float)."""
    x = ctx.arg(node.args[0])
    axis = x.tosa_dim(node.args[1])
    reduced = list(x.shape)
    reduced[axis] = 1
    m = ctx.emit(Op.REDUCE_MAX, [x], reduced, x.dtype, like=x, attr=make_attr("ReduceMaxAttribute", axis, NAN_PROPAGATE))
    d = ctx.emit(Op.SUB, [x, m], x.shape, x.dtype, like=x)
    e = ctx.emit(Op.EXP, [d], x.shape, x.dtype, like=x)
    s = ctx.emit(Op.REDUCE_SUM, [e], reduced, x.dtype, like=x, attr=make_attr("ReduceSumAttribute", axis))
    r = ctx.emit(Op.RECIPROCAL, [s], reduced, x.dtype, like=x)
    shift = ctx.g.const(np.zeros(1, np.int8), DType.INT8)
    return ctx.emit(Op.MUL, [e, r, shift], x.shape, x.dtype, like=x, node=node)
