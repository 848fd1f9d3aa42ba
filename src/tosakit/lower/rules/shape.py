"""Data movement: RESHAPE, SLICE, CONCAT, TILE, PAD, REVERSE and GATHER; permutes only relabel the layout.

Values may sit in NHWC order inside a delegate: rules address torch dims through ``Value.tosa_dim``, and
adding or removing size-1 dims keeps the layout (a RESHAPE, never a TRANSPOSE). Integers keep their
quantization: the quantizer shares one between input and output, so no rule here rescales except ``cat``.
"""

from __future__ import annotations

import math
import operator

import numpy as np
import torch
from torch.fx import Node

from ...quantize.qdq import QParams
from ..lowering import Lowering, int_dtype, lowers, make_attr, order_is_trivial
from ..tosa_graph import Op, Value, identity

aten = torch.ops.aten
MAX_RANK = 6  # TOSA 1.0, level 8K
COPY_OPS = {aten.clone.default, aten.alias.default, aten.contiguous.default, aten.lift_fresh_copy.default}


# ------------------------------------------------------------------ checks


def _ranks(node: Node) -> list[int]:
    vals = [a.meta.get("val") for a in node.all_input_nodes]
    out = node.meta.get("val")
    vals += list(out) if isinstance(out, (tuple, list)) else [out]
    return [v.dim() for v in vals if isinstance(v, torch.Tensor)]


def rank_check(node: Node, spec) -> str | None:
    """TOSA's rank limit on every tensor the op reads or writes."""
    rank = max(_ranks(node), default=0)
    return f"rank {rank} exceeds TOSA's limit of {MAX_RANK}" if rank > MAX_RANK else None


def checks(*fns):
    """One check running ``rank_check`` and then ``fns`` in turn (the first reason wins)."""
    def check(node: Node, spec) -> str | None:
        for fn in (rank_check, *fns):
            why = fn(node, spec)
            if why:
                return why
        return None

    return check


def constant_source(a) -> Node | None:
    """The ``get_attr`` behind ``a`` (through copies), or None when ``a`` is computed at run time."""
    while isinstance(a, Node) and a.op == "call_function" and a.target in COPY_OPS:
        a = a.args[0]
    return a if isinstance(a, Node) and a.op == "get_attr" else None


# ------------------------------------------------------------------ layout-keeping helpers


def squeeze_dims(ctx: Lowering, v: Value, dims, node: Node | None = None) -> Value:
    """Drop the size-1 torch ``dims`` where they sit; the other dims keep their layout."""
    gone = {d % v.rank for d in dims if v.torch_shape[d] == 1}
    keep = [i for i, d in enumerate(v.order) if d not in gone]
    order = [v.order[i] - sum(g < v.order[i] for g in gone) for i in keep]
    return ctx.relayout(v, [v.shape[i] for i in keep], order, node)


def unsqueeze_dim(ctx: Lowering, v: Value, dim: int, node: Node | None = None) -> Value:
    """Insert a size-1 torch dim ``dim``, next to the dim it pushes right (identity order stays identity)."""
    dim %= v.rank + 1
    pos = v.order.index(dim) if dim < v.rank else v.rank
    order = [d + (d >= dim) for d in v.order]
    order.insert(pos, dim)
    shape = list(v.shape)
    shape.insert(pos, 1)
    return ctx.relayout(v, shape, order, node)


def lift(ctx: Lowering, v: Value, rank: int, node: Node | None = None) -> Value:
    """Prepend size-1 torch dims up to ``rank`` (broadcasting's implicit leading dims)."""
    k = rank - v.rank
    if k <= 0:
        return v
    return ctx.relayout(v, (1,) * k + v.shape, tuple(range(k)) + tuple(d + k for d in v.order), node)


def slice_axis(ctx: Lowering, v: Value, axis: int, start: int, size: int, node: Node | None = None) -> Value:
    """SLICE ``size`` elements from ``start`` along TOSA ``axis``."""
    if start == 0 and size == v.shape[axis]:
        return v
    begin = [0] * v.rank
    begin[axis] = start
    shape = list(v.shape)
    shape[axis] = size
    return ctx.emit(Op.SLICE, [v, ctx.g.shape_const(begin), ctx.g.shape_const(shape)], shape, v.dtype, like=v,
                    q=v.q, attr=make_attr("SliceAttribute"), node=node)


def concat(ctx: Lowering, vals: list[Value], axis: int, node: Node | None = None) -> Value:
    """CONCAT along TOSA ``axis`` (operands in one layout and quantization)."""
    if len(vals) == 1:
        return vals[0]
    shape = list(vals[0].shape)
    shape[axis] = sum(v.shape[axis] for v in vals)
    return ctx.emit(Op.CONCAT, vals, shape, vals[0].dtype, like=vals[0], q=vals[0].q,
                    attr=make_attr("ConcatAttribute", axis), node=node)


def tile(ctx: Lowering, v: Value, multiples, node: Node | None = None) -> Value:
    """TILE by ``multiples`` per TOSA dim."""
    multiples = [int(m) for m in multiples]
    if all(m == 1 for m in multiples):
        return v
    shape = [s * m for s, m in zip(v.shape, multiples)]
    return ctx.emit(Op.TILE, [v, ctx.g.shape_const(multiples)], shape, v.dtype, like=v, q=v.q,
                    attr=make_attr("TileAttribute"), node=node)


def reverse(ctx: Lowering, v: Value, axis: int, node: Node | None = None) -> Value:
    """REVERSE along TOSA ``axis``, seen as the W axis of [1, before, size, after] unless it already is
    an H or W axis (the only axes Ethos-U55 reverses); the view costs two RESHAPEs, no data moves."""
    if v.shape[axis] == 1:
        return v
    if axis in (v.rank - 2, v.rank - 3):
        return ctx.emit(Op.REVERSE, [v], v.shape, v.dtype, like=v, q=v.q,
                        attr=make_attr("ReverseAttribute", axis), node=node)
    view = (1, math.prod(v.shape[:axis]), v.shape[axis], math.prod(v.shape[axis + 1:]))
    r = reverse(ctx, ctx.relayout(v, view, identity(4), node), 2, node)
    return ctx.relayout(r, v.shape, v.order, node)


def pad(ctx: Lowering, v: Value, pads: dict[int, tuple[int, int]], value: float, node: Node | None = None) -> Value:
    """PAD TOSA axes by (before, after) with ``value`` (a real number, quantized like ``v``)."""
    padding = [p for axis in range(v.rank) for p in pads.get(axis, (0, 0))]
    if not any(padding):
        return v
    if v.q is not None:  # an infinite value (a "same" max pool's -inf) is the range's end
        value = (v.q.qmin if value < 0 else v.q.qmax) if not math.isfinite(value) else \
            min(max(round(value / v.q.s) + v.q.zp, v.q.qmin), v.q.qmax)
    fill = ctx.g.const(np.array([value]), v.dtype)
    shape = [s + padding[2 * i] + padding[2 * i + 1] for i, s in enumerate(v.shape)]
    return ctx.emit(Op.PAD, [v, ctx.g.shape_const(padding), fill], shape, v.dtype, like=v, q=v.q,
                    attr=make_attr("PadAttribute"), node=node)


def requantize_to(ctx: Lowering, v: Value, q: QParams | None, node: Node | None = None) -> Value:
    """``v`` in quantization ``q`` (a RESCALE only when it differs)."""
    if q is None or v.q is None or (v.q.s, v.q.zp, v.q.dtype) == (q.s, q.zp, q.dtype):
        return v
    return ctx.rescale(v, v.q.s / q.s, int_dtype(q), v.q.zp, q.zp, q=q, node=node)


# ------------------------------------------------------------------ reshapes and permutes


def _reshape_rule(ctx: Lowering, node: Node) -> Value:
    """Size-1 dims in or out keep the layout; any other reshape is a RESHAPE in torch order (a TRANSPOSE
    first when the layout moves more than size-1 dims)."""
    x, shape = ctx.arg(node.args[0]), node.meta["val"].shape
    return ctx.view(x, shape, node)


for _op in (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.flatten.using_ints):
    lowers(_op, int16=True, check=rank_check)(_reshape_rule)


@lowers(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default, int16=True, check=rank_check)
def squeeze(ctx: Lowering, node: Node) -> Value:
    """Size-1 dims dropped where they sit (squeeze() drops them all)."""
    x = ctx.arg(node.args[0])
    dims = node.args[1] if len(node.args) > 1 else range(x.rank)
    return squeeze_dims(ctx, x, [dims] if isinstance(dims, int) else dims, node)


@lowers(aten.unsqueeze.default, int16=True, check=rank_check)
def unsqueeze(ctx: Lowering, node: Node) -> Value:
    """A size-1 dim added in place."""
    return unsqueeze_dim(ctx, ctx.arg(node.args[0]), node.args[1], node)


@lowers(aten.clone.default, aten.alias.default, aten.contiguous.default, int16=True)
def copy(ctx: Lowering, node: Node) -> Value:
    """Copies are free in TOSA: values are immutable."""
    return ctx.arg(node.args[0])


@lowers(aten.permute.default, int16=True)
def permute(ctx: Lowering, node: Node) -> Value:
    """No data moves: the value's layout records the new dimension order."""
    x = ctx.arg(node.args[0])
    dims = [d % x.rank for d in node.args[1]]
    return x.with_(order=tuple(dims.index(d) for d in x.order))


# ------------------------------------------------------------------ slicing


def _slice_range(node: Node) -> tuple[int, range]:
    """(dim, the indices taken) of ``slice.Tensor``."""
    args = list(node.args) + [None] * 4
    shape = node.args[0].meta["val"].shape
    dim = (args[1] or 0) % len(shape)
    return dim, range(shape[dim])[slice(args[2], args[3], args[4] or 1)]


def _slice_check(node: Node, spec) -> str | None:
    return None if len(_slice_range(node)[1]) else "an empty slice has no TOSA form"


def _every_step(ctx: Lowering, v: Value, axis: int, taken: range, node: Node) -> Value:
    """Every ``step``-th element along ``axis``: a window of ``count`` groups of ``step`` (starting up to
    step - 1 early so it fits, else PADded at the end), viewed as [before, count, step, after], keeps one
    element of each group."""
    count, step = len(taken), taken.step
    early = min(max(0, taken.start + count * step - v.shape[axis]), taken.start, step - 1)
    begin = taken.start - early
    v = slice_axis(ctx, v, axis, begin, min(count * step, v.shape[axis] - begin), node)
    v = pad(ctx, v, {axis: (0, count * step - v.shape[axis])}, 0.0, node)
    view = (math.prod(v.shape[:axis]), count, step, math.prod(v.shape[axis + 1:]))
    picked = slice_axis(ctx, ctx.relayout(v, view, identity(4), node), 2, early, 1, node)
    shape = list(v.shape)
    shape[axis] = count
    return ctx.relayout(picked, shape, v.order, node)


@lowers(aten.slice.Tensor, int16=True, check=checks(_slice_check))
def slice_(ctx: Lowering, node: Node) -> Value:
    """SLICE; a step above 1 takes the first of each group of ``step`` (TOSA has no strided slice)."""
    x = ctx.arg(node.args[0])
    dim, taken = _slice_range(node)
    axis = x.tosa_dim(dim)
    if taken.step == 1 or len(taken) == 1:
        return slice_axis(ctx, x, axis, taken.start, len(taken), node)
    return _every_step(ctx, x, axis, taken, node)


@lowers(aten.select.int, int16=True, check=rank_check)
def select(ctx: Lowering, node: Node) -> Value:
    """A SLICE of one, its dim dropped in place."""
    x = ctx.arg(node.args[0])
    dim = node.args[1] % x.rank
    index = node.args[2] % x.torch_shape[dim]
    return squeeze_dims(ctx, slice_axis(ctx, x, x.tosa_dim(dim), index, 1, node), [dim], node)


@lowers(aten.split_with_sizes.default, int16=True, check=rank_check)
def split_with_sizes(ctx: Lowering, node: Node) -> list[Value | None]:
    """One SLICE per part that is used (getitem)."""
    x = ctx.arg(node.args[0])
    sizes = list(node.args[1])
    axis = x.tosa_dim(node.args[2] if len(node.args) > 2 else 0)
    used = {u.args[1] for u in node.users if u.target is operator.getitem}
    starts = np.cumsum([0] + sizes[:-1])
    return [slice_axis(ctx, x, axis, int(s), n, node) if i in used else None
            for i, (s, n) in enumerate(zip(starts, sizes))]


# ------------------------------------------------------------------ joining and repeating


def _cat_check(node: Node, spec) -> str | None:
    if any(a.meta["val"].numel() == 0 for a in node.args[0]):
        return "cat with an empty input has no TOSA form"
    return None


@lowers(aten.cat.default, int16=True, check=checks(_cat_check))
def cat(ctx: Lowering, node: Node) -> Value:
    """CONCAT in one layout; integers in one quantization (the quantizer shares it, so the RESCALE
    here only runs for inputs quantized elsewhere)."""
    vals = ctx.same_order(*[ctx.arg(a) for a in node.args[0]])
    q = ctx.q_of(node) or vals[0].q
    vals = [requantize_to(ctx, v, q, node) for v in vals]
    dim = node.args[1] if len(node.args) > 1 else 0
    return concat(ctx, vals, vals[0].tosa_dim(dim % vals[0].rank), node)


@lowers(aten.expand.default, aten.repeat.default, int16=True, check=rank_check)
def expand(ctx: Lowering, node: Node) -> Value:
    """TILE to the output shape (leading dims added first, in place). A layout still pending is put in torch
    order before the TILE, on the smaller tensor (attention's keys and values, transposed then repeated for each
    query head)."""
    out = tuple(node.meta["val"].shape)
    x = lift(ctx, ctx.arg(node.args[0]), len(out), node)
    if math.prod(out) > math.prod(x.torch_shape) and not order_is_trivial(x):
        x = ctx.torch_order(x)
    return tile(ctx, x, [out[d] // x.torch_shape[d] for d in x.order], node)


@lowers(aten.flip.default, int16=True, check=rank_check)
def flip(ctx: Lowering, node: Node) -> Value:
    """A REVERSE per flipped dim."""
    x = ctx.arg(node.args[0])
    for d in node.args[1]:
        x = reverse(ctx, x, x.tosa_dim(d % x.rank), node)
    return x


# ------------------------------------------------------------------ padding


def _torch_pads(node: Node) -> dict[int, tuple[int, int]]:
    """torch's flat pad list (last dim first) as {torch dim: (before, after)}."""
    flat = list(node.args[1])
    rank = node.args[0].meta["val"].dim()
    return {rank - 1 - i: (flat[2 * i], flat[2 * i + 1]) for i in range(len(flat) // 2)}


def _constant_pad_check(node: Node, spec) -> str | None:
    if any(p < 0 for p in node.args[1]):
        return "constant_pad_nd with negative padding (cropping) has no lowering yet"
    return None


@lowers(aten.constant_pad_nd.default, int16=True, check=checks(_constant_pad_check))
def constant_pad_nd(ctx: Lowering, node: Node) -> Value:
    """PAD with the constant (quantized with the input's parameters, which the output shares)."""
    x = ctx.arg(node.args[0])
    value = float(node.args[2]) if len(node.args) > 2 else 0.0
    return pad(ctx, x, {x.tosa_dim(d): p for d, p in _torch_pads(node).items()}, value, node)


def _reflect_check(node: Node, spec) -> str | None:
    shape = node.args[0].meta["val"].shape
    if any(max(p) >= shape[d] for d, p in _torch_pads(node).items()):
        return "reflection padding must be smaller than the padded dim"
    return None


def _edge_pad(ctx: Lowering, node: Node, edge) -> Value:
    """Pad each dim on both sides with ``edge(v, axis, before, count, size)`` (None when count is 0), by CONCAT."""
    x = ctx.arg(node.args[0])
    for d, (lo, hi) in _torch_pads(node).items():
        axis, size = x.tosa_dim(d), x.torch_shape[d]
        parts = [edge(x, axis, True, lo, size), x, edge(x, axis, False, hi, size)]
        x = concat(ctx, [p for p in parts if p is not None], axis, node)
    return x


@lowers(aten.reflection_pad1d.default, aten.reflection_pad2d.default, aten.reflection_pad3d.default,
        check=checks(_reflect_check))
def reflection_pad(ctx: Lowering, node: Node) -> Value:
    """Mirror images of the first and last rows (not repeating the edge): SLICE, REVERSE, CONCAT."""
    def mirror(v, axis, before, n, size):
        if n == 0:
            return None
        return reverse(ctx, slice_axis(ctx, v, axis, 1 if before else size - 1 - n, n, node), axis, node)

    return _edge_pad(ctx, node, mirror)


@lowers(aten.replication_pad1d.default, aten.replication_pad2d.default, aten.replication_pad3d.default,
        check=rank_check)
def replication_pad(ctx: Lowering, node: Node) -> Value:
    """The edge rows repeated: SLICE, TILE, CONCAT."""
    def repeat_edge(v, axis, before, n, size):
        if n == 0:
            return None
        multiples = [n if i == axis else 1 for i in range(v.rank)]
        return tile(ctx, slice_axis(ctx, v, axis, 0 if before else size - 1, 1, node), multiples, node)

    return _edge_pad(ctx, node, repeat_edge)


# ------------------------------------------------------------------ indexing: GATHER and SCATTER rows


def _index_dtype_check(a) -> str | None:
    """Indices computed at run time must be int32 (TOSA has no int64)."""
    if constant_source(a) is None and a.meta["val"].dtype != torch.int32:
        return (f"indices computed at run time are {a.meta['val'].dtype} but TOSA indexes with int32 (it has no "
                "int64): pass int32 positions or ids")
    return None


def _index_check(node: Node, spec) -> str | None:
    if spec.is_u55_subset and constant_source(node.args[2]) is None:
        return "indices computed at run time need TOSA GATHER, which Ethos-U55/U65 do not support"
    return _index_dtype_check(node.args[2])


def _gather_check(node: Node, spec) -> str | None:
    if spec.is_u55_subset:
        return "gather needs TOSA GATHER, which Ethos-U55/U65 do not support"
    if constant_source(node.args[2]) is None and not _one_row(node):
        return (f"{node.target} with indices computed at run time along a tensor with other axes above 1 (only "
                "constant indices, or one row of them, are lowered)")
    return None


def _one_row(node: Node) -> bool:
    """A gather whose input and indices have size 1 on every axis but the gathered one."""
    x, index, dim = node.args[0].meta["val"], node.args[2].meta["val"], node.args[1] % node.args[0].meta["val"].dim()
    return all(x.shape[d] == 1 and index.shape[d] == 1 for d in range(x.dim()) if d != dim)


def _rows(ctx: Lowering, a, before: int, size: int, node: Node) -> Value:
    """int32 row indices [before, W] for GATHER/SCATTER: constant ones wrapped into 0..size-1, run-time ones
    (int32, in range: TOSA has no negative indexing) tiled over ``before``."""
    src = constant_source(a)
    if src is not None:
        index = ctx.constant(src).reshape(1, -1).long() % size
        return ctx.const_value(index.repeat(before, 1).to(torch.int32))
    idx = ctx.reshape(ctx.arg(a), (1, a.meta["val"].numel()), node)
    return tile(ctx, idx, (before, 1), node)


def _gather(ctx: Lowering, values: Value, indices: Value, node: Node) -> Value:
    """GATHER rows of values [N, K, C] at int32 ``indices`` [N, W] -> [N, W, C]."""
    n, _, c = values.shape
    shape = (n, indices.shape[1], c)
    return ctx.emit(Op.GATHER, [values, indices], shape, values.dtype, order=identity(3), q=values.q,
                    attr=make_attr("GatherAttribute"), node=node)


def _gather_dim(ctx: Lowering, x: Value, dim: int, index, node: Node) -> Value:
    """x's slices along ``dim`` at ``index`` (a GATHER over [before, dim, after]), in the node's shape."""
    shape = x.torch_shape
    before, after = math.prod(shape[:dim]), math.prod(shape[dim + 1:])
    values = ctx.reshape(x, (before, shape[dim], after), node)
    y = _gather(ctx, values, _rows(ctx, index, before, shape[dim], node), node)
    return ctx.reshape(y, node.meta["val"].shape, node)


def _runs(index: list[int]) -> list[tuple[int, int]]:
    """Consecutive runs of ``index`` as (start, length)."""
    runs: list[tuple[int, int]] = []
    for i in index:
        if runs and runs[-1][0] + runs[-1][1] == i:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((i, 1))
    return runs


@lowers(aten.index_select.default, int16=True, check=checks(_index_check))
def index_select(ctx: Lowering, node: Node) -> Value:
    """Constant indices on Ethos-U55/U65 (which lack GATHER): a SLICE per run of consecutive indices and a
    CONCAT; elsewhere, and for int32 indices computed at run time, a GATHER over [before, dim, after]."""
    x = ctx.arg(node.args[0])
    dim = node.args[1] % x.rank
    if ctx.spec.is_u55_subset:
        size = x.torch_shape[dim]
        index = [int(i) % size for i in ctx.constant(constant_source(node.args[2])).reshape(-1)]
        axis = x.tosa_dim(dim)
        return concat(ctx, [slice_axis(ctx, x, axis, s, n, node) for s, n in _runs(index)], axis, node)
    return _gather_dim(ctx, x, dim, node.args[2], node)


def _one_index(node: Node) -> tuple[int, Node] | None:
    """(dim, index) of ``x[..., index, ...]``: one integer index tensor, every other position None."""
    given = [(d, i) for d, i in enumerate(node.args[1]) if i is not None]
    return given[0] if len(given) == 1 else None


def _advanced_index_check(node: Node, spec) -> str | None:
    """One integer index tensor (int32 when computed at run time); the TOSA op exists on the target."""
    one = _one_index(node)
    if one is None:
        return "indexing with more than one index tensor (only x[..., index, ...] with one is lowered)"
    if one[1].meta["val"].dtype == torch.bool:
        return "a boolean mask as index gives a data-dependent shape, which TOSA cannot express"
    if spec.is_u55_subset:
        op = "GATHER" if node.target == aten.index.Tensor else "SCATTER"
        return f"{op} is outside the Ethos-U55/U65 TOSA subset"
    return _index_dtype_check(one[1])


@lowers(aten.index.Tensor, u55=False, int16=True, check=checks(_advanced_index_check),
        note="it needs TOSA GATHER")
def index(ctx: Lowering, node: Node) -> Value:
    """``x[..., index, ...]`` (a table row at a position, a rotary angle): GATHER over [before, dim, after]."""
    dim, idx = _one_index(node)
    return _gather_dim(ctx, ctx.arg(node.args[0]), dim, idx, node)


def _index_put_check(node: Node, spec) -> str | None:
    args = list(node.args) + [False] * (4 - len(node.args))
    if args[3]:
        return "index_put with accumulate=True (a scatter-add; TOSA SCATTER writes each row once)"
    return _advanced_index_check(node, spec)


@lowers(aten.index_put.default, u55=False, int16=True, check=checks(_index_put_check),
        note="it needs TOSA SCATTER")
def index_put(ctx: Lowering, node: Node) -> Value:
    """``x[..., index, ...] = values`` (a KV cache written at the new positions): SCATTER over [before, dim,
    after]; the values take x's quantization. TOSA writes each row once: indices must not repeat."""
    x = ctx.arg(node.args[0])
    dim, idx = _one_index(node)
    shape = x.torch_shape
    before, size, after = math.prod(shape[:dim]), shape[dim], math.prod(shape[dim + 1:])
    count = idx.meta["val"].numel()
    target = (*shape[:dim], count, *shape[dim + 1:])
    values = lift(ctx, ctx.arg(node.args[2]), len(target), node)
    values = ctx.torch_order(values)
    values = tile(ctx, values, [t // s for t, s in zip(target, values.torch_shape)], node)
    if x.q is not None and values.q is not None and (values.q.s, values.q.zp) != (x.q.s, x.q.zp):
        values = ctx.rescale(values, values.q.s / x.q.s, x.dtype, values.q.zp, x.q.zp, q=x.q, node=node)
    rows = _rows(ctx, idx, before, size, node)
    out = ctx.emit(Op.SCATTER, [ctx.reshape(x, (before, size, after), node), rows,
                                ctx.reshape(values, (before, count, after), node)],
                   (before, size, after), x.dtype, order=identity(3), q=x.q, attr=make_attr("ScatterAttribute"),
                   node=node)
    return ctx.reshape(out, shape, node)


@lowers(aten.gather.default, int16=True, check=checks(_gather_check))
def gather(ctx: Lowering, node: Node) -> Value:
    """Constant indices: each output element's flat source position, one GATHER over the flat input; indices
    computed at run time into one row (a token-type or position table read at computed positions): those."""
    x = ctx.arg(node.args[0])
    dim = node.args[1] % x.rank
    if constant_source(node.args[2]) is None:
        count = node.args[2].meta["val"].numel()
        values = ctx.reshape(x, (1, x.torch_shape[dim], 1), node)
        y = _gather(ctx, values, ctx.reshape(ctx.arg(node.args[2]), (1, count), node), node)
        return ctx.reshape(y, node.meta["val"].shape, node)
    index = ctx.constant(constant_source(node.args[2]))
    positions = torch.arange(math.prod(x.torch_shape)).reshape(x.torch_shape)
    flat = torch.gather(positions, dim, index.long()).reshape(1, -1)
    values = ctx.reshape(x, (1, positions.numel(), 1), node)
    y = _gather(ctx, values, ctx.const_value(flat.to(torch.int32)), node)
    return ctx.reshape(y, node.meta["val"].shape, node)
