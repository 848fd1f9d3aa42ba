"""Attention building blocks: MATMUL for bmm/mm (int8 x int8 -> int32, int16 x int16 -> int48, then RESCALE in INT),
GATHER for embedding."""

from __future__ import annotations

import torch
from torch.fx import Node

from ..lowering import Lowering, accumulator, int_dtype, lowers, make_attr
from ..tosa_graph import Op, Value
from .elementwise import mul

aten = torch.ops.aten

# sdpa's float decomposition scales q and k by a Python number (the INT path has tensors there).
lowers(aten.mul.Scalar)(mul)


def _unsliced(ctx: Lowering, a: Value) -> Value:
    """A MATMUL's left operand that Vela 5.2 reads correctly on Ethos-U55/U65. When it is a SLICE of a wider
    tensor (q of a fused qkv projection), Vela folds the slice into the read but keeps the wider tensor's depth
    for its elementwise MUL and REDUCE_SUM steps, which then compute wrong values and write past their buffer
    (the NPU simulator shows it): the slice is copied into a tensor of its own first, by an identity RESCALE."""
    source = ctx.g.source(a.name)
    if not ctx.spec.is_u55_subset or a.q is None or source is None or source.op != "SLICE":
        return a
    return ctx.rescale(a, 1.0, a.dtype, a.q.zp, a.q.zp, q=a.q)


def _matmul3(ctx: Lowering, node: Node, a: Value, b: Value) -> Value:
    """MATMUL of [N, H, C] x [N, C, W] in torch order; the INT result (int32, or int48 for int16 operands) is
    requantized to the node's output."""
    a, b = _unsliced(ctx, ctx.torch_order(a)), ctx.torch_order(b)
    shape = (a.shape[0], a.shape[1], b.shape[2])
    q_out = ctx.q_of(node)
    if q_out is None:
        zps = [ctx.g.zero_point(0, a.dtype), ctx.g.zero_point(0, b.dtype)]
        return ctx.emit(Op.MATMUL, [a, b, *zps], shape, a.dtype, attr=make_attr("MatMulAttribute"), node=node)
    zps = [ctx.g.zero_point(a.q.zp, a.dtype), ctx.g.zero_point(b.q.zp, b.dtype)]
    acc = ctx.emit(Op.MATMUL, [a, b, *zps], shape, accumulator(a), attr=make_attr("MatMulAttribute"), node=node)
    out = ctx.rescale(acc, a.q.s * b.q.s / q_out.s, int_dtype(q_out), 0, q_out.zp, q=q_out, node=node)
    return ctx.fused_clamp(out, node)


@lowers(aten.bmm.default, int16=True)
def bmm(ctx: Lowering, node: Node) -> Value:
    return _matmul3(ctx, node, ctx.arg(node.args[0]), ctx.arg(node.args[1]))


@lowers(aten.mm.default, int16=True)
def mm(ctx: Lowering, node: Node) -> Value:
    """[H, C] x [C, W] as a batch of one."""
    a, b = (ctx.arg(x) for x in node.args[:2])
    a3 = ctx.reshape(a, (1, *a.torch_shape))
    b3 = ctx.reshape(b, (1, *b.torch_shape))
    return ctx.reshape(_matmul3(ctx, node, a3, b3), node.meta["val"].shape, node=node)


def _embedding_check(node: Node, spec) -> str | None:
    if node.args[1].meta["val"].dtype != torch.int32:
        return "embedding indices are int64 but TOSA GATHER takes int32 indices (TOSA has no int64): pass int32 ids"
    return None


@lowers(aten.embedding.default, u55=False, int16=True, check=_embedding_check,
        note="it needs TOSA GATHER")
def embedding(ctx: Lowering, node: Node) -> Value:
    """GATHER rows of the [1, V, D] table at the [1, W] flattened indices."""
    table, idx = ctx.arg(node.args[0]), ctx.arg(node.args[1])
    vocab, dim = table.torch_shape
    count = int(torch.tensor(idx.torch_shape).prod())
    values = ctx.reshape(table, (1, vocab, dim))
    indices = ctx.reshape(idx, (1, count))
    out = ctx.emit(Op.GATHER, [values, indices], (1, count, dim), table.dtype, q=table.q,
                   attr=make_attr("GatherAttribute"), node=node)
    return ctx.reshape(out, node.meta["val"].shape, node=node)
