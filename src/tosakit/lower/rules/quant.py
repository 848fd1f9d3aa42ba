"""Quantize/dequantize left between float and integer ops inside an FP+INT graph."""

from __future__ import annotations

import numpy as np
from torch.fx import Node

from ...quantize.qdq import DEQUANTIZE_OPS, QUANTIZE_OPS, qparams_of
from ..lowering import Lowering, int_dtype, lowers
from ..tosa_graph import DType, Op, Value


def _per_tensor(node: Node, spec) -> str | None:
    q = qparams_of(node) if not any(isinstance(a, Node) for a in node.args[1:3]) else None
    return None if q is not None and not q.per_channel else "only per-tensor quantize/dequantize lower to TOSA"


def _mul(ctx: Lowering, v: Value, k: float) -> Value:
    shift = ctx.g.const(np.zeros(1, np.int8), DType.INT8)
    return ctx.emit(Op.MUL, [v, ctx.scalar(k, v), shift], v.shape, v.dtype, like=v)


@lowers(*QUANTIZE_OPS, fp=True, int=True, u55=False, check=_per_tensor)
def quantize(ctx: Lowering, node: Node) -> Value:
    """float -> integers: x / scale + zero_point, clamped, then CAST (round to nearest)."""
    x = ctx.arg(node.args[0])
    q = qparams_of(node)
    y = _mul(ctx, x, 1.0 / q.s)
    y = ctx.emit(Op.ADD, [y, ctx.scalar(float(q.zp), y)], y.shape, y.dtype, like=y)
    y = ctx.clamp(y, float(q.qmin), float(q.qmax))
    return ctx.emit(Op.CAST, [y], y.shape, int_dtype(q), like=y, q=q, node=node)


@lowers(*DEQUANTIZE_OPS, fp=True, int=True, u55=False, check=_per_tensor)
def dequantize(ctx: Lowering, node: Node) -> Value:
    """integers -> float: (q - zero_point) * scale."""
    x = ctx.arg(node.args[0])
    q = qparams_of(node)
    y = ctx.emit(Op.CAST, [x], x.shape, DType.FP32, like=x)
    y = ctx.emit(Op.SUB, [y, ctx.scalar(float(q.zp), y)], y.shape, y.dtype, like=y)
    return _mul(ctx, y, q.s).with_(q=None)



