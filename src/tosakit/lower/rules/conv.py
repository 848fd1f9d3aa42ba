"""Convolution and linear layers: CONV2D / DEPTHWISE_CONV2D, with int32 accumulators in INT."""

from __future__ import annotations

import numpy as np
import torch
from torch.fx import Node

from ...quantize.qdq import QParams
from ..lowering import Lowering, is_constant, int_dtype, lowers, make_attr, tosa_pads
from ..tosa_graph import NHWC, DType, Op, Value

aten = torch.ops.aten


def _conv_check(node: Node, spec) -> str | None:
    x, w = node.args[0], node.args[1]
    if node.args[6]:
        return "transposed convolution has no lowering yet"
    if not is_constant(w):
        return "convolution weights must be constants"
    rank = x.meta["val"].dim()
    if rank not in (3, 4):
        return f"only 1-D and 2-D convolution are lowered (input rank {rank})"
    groups = node.args[8]
    cin = x.meta["val"].shape[1]
    if groups != 1 and not (groups == cin):
        return f"grouped convolution (groups={groups}, {cin} input channels) has no lowering yet"
    return None


def _weight_check(node: Node, spec) -> str | None:
    return None if is_constant(node.args[1]) else "linear weights must be constants"


def _requant(ctx: Lowering, acc: Value, in_scale: float, w_scale, node: Node) -> Value:
    """int32 accumulator -> output integers, with any fused activation clamp."""
    q_out: QParams = ctx.q_of(node)
    scales = in_scale * np.atleast_1d(np.asarray(w_scale, dtype=np.float64)) / q_out.s
    out = ctx.rescale(acc, scales if scales.size > 1 else float(scales[0]), int_dtype(q_out), 0, q_out.zp,
                      q=q_out, node=node)
    return ctx.fused_clamp(out, node)


def _bias(ctx: Lowering, b, oc: int, in_scale: float | None, w_scale) -> str:
    """The bias tensor: int32 in INT (quantized with in_scale x weight scale), float in FP."""
    if in_scale is None:
        arr = np.zeros(oc, np.float32) if b is None else ctx.constant(b).float().numpy()
        return ctx.g.const(arr, DType.FP32)
    if b is None:
        return ctx.g.const(np.zeros(oc, np.int32), DType.INT32)
    t = ctx.constant(b)
    if t.dtype == torch.int32:  # already quantized by the quantizer (scale = input x weight)
        return ctx.g.const(t.numpy(), DType.INT32)
    scale = in_scale * np.broadcast_to(np.asarray(w_scale, dtype=np.float64), (oc,))
    return ctx.g.const(np.clip(np.round(t.double().numpy() / scale), -(2**31), 2**31 - 1).astype(np.int32), DType.INT32)


def _conv2d(ctx: Lowering, node: Node, x: Value, w: torch.Tensor, b, stride, pad, dilation, groups,
            out_nchw: tuple[int, ...]) -> Value:
    """CONV2D or DEPTHWISE_CONV2D on an NHWC value; returns the NHWC result."""
    x = ctx.nhwc(x)
    n, ih, iw, cin = x.shape
    oc, _, kh, kw = w.shape
    q_w: QParams | None = node.args[1].meta.get("tosakit_q")
    integer = ctx.q_of(node) is not None
    pads = tosa_pads((ih, iw), (kh, kw), stride, pad, dilation)
    out_shape = (n, out_nchw[2], out_nchw[3], oc)
    depthwise = groups > 1
    w_np = w.numpy()
    if depthwise:  # [C*M, 1, KH, KW] -> [KH, KW, C, M]
        w_np = w_np.reshape(cin, oc // cin, kh, kw).transpose(2, 3, 0, 1)
    else:  # OIHW -> OHWI
        w_np = w_np.transpose(0, 2, 3, 1)
    w_dtype = DType.INT8 if integer else DType.FP32
    weight = ctx.g.const(np.ascontiguousarray(w_np), w_dtype)
    if integer:
        w_scale = q_w.scale
        bias = _bias(ctx, b, oc, x.q.s, w_scale)
        zps = [ctx.g.zero_point(x.q.zp, DType.INT8), ctx.g.zero_point(0, DType.INT8)]
        acc_type, out_dtype = DType.INT32, DType.INT32
    else:
        bias = _bias(ctx, b, oc, None, None)
        zps = [ctx.g.zero_point(0, DType.FP32), ctx.g.zero_point(0, DType.FP32)]
        acc_type, out_dtype = DType.FP32, DType.FP32
    kind = "DepthwiseConv2dAttribute" if depthwise else "Conv2dAttribute"
    attr = make_attr(kind, pads, list(stride), list(dilation), False, acc_type)
    op = Op.DEPTHWISE_CONV2D if depthwise else Op.CONV2D
    acc = ctx.emit(op, [x, weight, bias, *zps], out_shape, out_dtype, order=NHWC, attr=attr, node=node)
    if integer:
        return _requant(ctx, acc, x.q.s, w_scale, node)
    return ctx.fused_clamp(acc, node)


@lowers(aten.convolution.default, check=_conv_check)
def convolution(ctx: Lowering, node: Node) -> Value:
    x_node, w_node, b_node, stride, pad, dilation, _, _, groups = node.args
    x = ctx.arg(x_node)
    w = ctx.constant(w_node)
    out = tuple(node.meta["val"].shape)
    if x.rank == 3:  # conv1d: [N, C, L] as [N, C, 1, L]
        n, c, length = x.torch_shape
        x4 = ctx.reshape(x, (n, c, 1, length))
        y = _conv2d(ctx, node, x4, w.unsqueeze(2), b_node, (1, stride[0]), (0, pad[0]), (1, dilation[0]),
                    groups, (out[0], out[1], 1, out[2]))
        return ctx.reshape(y, out, node=node)
    return _conv2d(ctx, node, x, w, b_node, tuple(stride), tuple(pad), tuple(dilation), groups, out)


@lowers(aten.linear.default, check=_weight_check)
def linear(ctx: Lowering, node: Node) -> Value:
    """A 1x1 CONV2D over [rows, 1, 1, in_features]: the form Vela runs as a fully connected layer."""
    x_node, w_node = node.args[0], node.args[1]
    b_node = node.args[2] if len(node.args) > 2 else None
    x = ctx.arg(x_node)
    w = ctx.constant(w_node)
    shape = x.torch_shape
    rows = int(np.prod(shape[:-1]))
    x4 = ctx.reshape(x, (rows, shape[-1], 1, 1))  # NCHW view so the NHWC form is [rows, 1, 1, in]
    out = tuple(node.meta["val"].shape)
    y = _conv2d(ctx, node, x4, w.reshape(w.shape[0], w.shape[1], 1, 1), b_node, (1, 1), (0, 0), (1, 1), 1,
                (rows, w.shape[0], 1, 1))
    return ctx.reshape(y, out, node=node)
