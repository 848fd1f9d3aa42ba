"""Pooling, reductions and resampling: AVG_POOL2D, MAX_POOL2D, REDUCE_SUM/REDUCE_MAX, softmax, RESIZE."""

from __future__ import annotations

import math

import numpy as np
import tosa_serializer as ts
import torch
from torch.fx import Node

from ...quantize.annotate import spatial_mean
from ..lowering import NAN_PROPAGATE, Lowering, accumulator, int_dtype, lowers, make_attr
from ..tosa_graph import NHWC, DType, Op, Value
from .conv import concat, slice_axis

aten = torch.ops.aten


def _dims(node: Node) -> list[int]:
    rank = node.args[0].meta["val"].dim()
    dims = node.args[1] if len(node.args) > 1 and node.args[1] is not None else list(range(rank))
    return sorted(d % rank for d in ([dims] if isinstance(dims, int) else dims))


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


@lowers(aten.mean.dim, int16=True)
def mean(ctx: Lowering, node: Node) -> Value:
    x = ctx.arg(node.args[0])
    out = tuple(node.meta["val"].shape)
    q_out = ctx.q_of(node)
    rounds_once = x.q is None or (q_out.s, q_out.zp) == (x.q.s, x.q.zp)
    if spatial_mean(node) and rounds_once:  # global average pooling (a new scale: sum, one rescale)
        n, c, h, w = x.torch_shape
        y = _avg_pool(ctx, node, x, (h, w), (1, 1), (0, 0, 0, 0), (n, c, 1, 1))
        return ctx.view(y, out, node) if len(out) != 4 else y
    if _dims(node) == [x.rank - 1] and x.rank >= 3 and x.tosa_dim(x.rank - 1) == 0 and x.shape[0] > 1:
        x = ctx.torch_order(x)  # a layer norm's input stored with its features outermost: moved, for all its users
        ctx.values[node.args[0]] = x
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
    return ctx.view(v, out, node)


def _avg_pool_check(node: Node, spec) -> str | None:
    args = list(node.args) + [None] * 7
    if args[6] is not None:
        return "avg_pool2d with divisor_override has no lowering yet"
    return None


def _pool_pads(sizes, kernel, stride, pad, out_sizes) -> list[int]:
    """[top, bottom, left, right] for a TOSA pool giving torch's output size exactly: the far pad is what the
    last window needs (below ``pad`` when torch's windows stop short, above it in ceil mode)."""
    pads = []
    for size, k, s, p, o in zip(sizes, kernel, stride, pad, out_sizes):
        pads += [p, (o - 1) * s + k - size - p]
    return pads


def _explicit_pads(ctx: Lowering, x: Value, pads: list[int], counted: list[int]) -> tuple[Value, list[int]]:
    """NHWC ``x`` with negative far pads sliced off and up to ``counted`` of each pad made a PAD of zeros (the
    zero point), which an average counts: the pads left for the pool itself, which it does not count."""
    x = ctx.nhwc(x)
    for axis, hi in ((1, pads[1]), (2, pads[3])):
        if hi < 0:
            x = slice_axis(ctx, x, axis, 0, x.shape[axis] + hi)
    left = [max(p, 0) for p in pads]
    made = [min(p, c) for p, c in zip(left, counted)]
    if not any(made):
        return x, left
    padding = [0, 0, *made, 0, 0]
    shape = (x.shape[0], x.shape[1] + made[0] + made[1], x.shape[2] + made[2] + made[3], x.shape[3])
    fill = ctx.g.const(np.array([x.q.zp if x.q is not None else 0]), x.dtype)
    x = ctx.emit(Op.PAD, [x, ctx.g.shape_const(padding), fill], shape, x.dtype, like=x, q=x.q,
                 attr=make_attr("PadAttribute"))
    return x, [p - m for p, m in zip(left, made)]


@lowers(aten.avg_pool2d.default, int16=True, check=_avg_pool_check)
def avg_pool2d(ctx: Lowering, node: Node) -> Value:
    """AVG_POOL2D; padding that torch counts (count_include_pad, the default) becomes an explicit PAD, so
    the pool itself is unpadded (Ethos-U55 then allows kernels beyond 8x8). In ceil mode the windows past the
    padded input count only what they cover, as the pool's own pad does."""
    args = list(node.args) + [None] * 7
    kernel = list(args[1])
    stride = list(args[2] or kernel)
    pad = list(args[3] or [0, 0])
    out = tuple(node.meta["val"].shape)
    x = ctx.arg(args[0])
    pads = _pool_pads(x.torch_shape[2:], kernel, stride, pad, out[2:])
    counted = [pad[0], pad[0], pad[1], pad[1]] if args[5] is not False else [0, 0, 0, 0]
    x, pads = _explicit_pads(ctx, x, pads, counted)
    return _avg_pool(ctx, node, x, kernel, stride, pads, out)


def _adaptive_check(node: Node, spec) -> str | None:
    size = node.args[0].meta["val"].shape[2:]
    out = node.args[1]
    if len(size) != 2 or any(o is None for o in out):
        return "only 2-D adaptive pooling with a fixed output size is lowered"
    if any(s % o for s, o in zip(size, out)):
        return (f"adaptive pooling from {tuple(size)} to {tuple(out)} needs windows of different sizes; "
                "only output sizes that divide the input size lower (as one pool)")
    return None


def _adaptive_window(node: Node) -> list[int]:
    """Kernel (= stride) of the pool an evenly dividing adaptive pool is."""
    size = node.args[0].meta["val"].shape[2:]
    return [int(s) // int(o) for s, o in zip(size, node.args[1])]


@lowers(aten._adaptive_avg_pool2d.default, int16=True, check=_adaptive_check)
def adaptive_avg_pool2d(ctx: Lowering, node: Node) -> Value:
    window = _adaptive_window(node)
    return _avg_pool(ctx, node, ctx.arg(node.args[0]), window, window, [0, 0, 0, 0], node.meta["val"].shape)


def _adaptive_max_check(node: Node, spec) -> str | None:
    if any(u.args[1] != 0 for u in node.users):
        return "adaptive_max_pool2d indices are used; only the values can be lowered"
    return _adaptive_check(node, spec)


@lowers(aten.adaptive_max_pool2d.default, int16=True, check=_adaptive_max_check)
def adaptive_max_pool2d(ctx: Lowering, node: Node) -> tuple[Value]:
    window = _adaptive_window(node)
    return (_max_pool(ctx, node, ctx.arg(node.args[0]), window, window, [0, 0, 0, 0], node.meta["val"][0].shape),)


def _max_pool_check(node: Node, spec) -> str | None:
    args = list(node.args) + [None] * 6
    dilation = args[4]
    if dilation and any(d != 1 for d in dilation):
        return "max_pool2d with dilation has no lowering yet"
    if any(u.args[1] != 0 for u in node.users):
        return "max_pool2d indices are used; only the values can be lowered"
    return None


@lowers(aten.max_pool2d_with_indices.default, int16=True, check=_max_pool_check)
def max_pool2d(ctx: Lowering, node: Node) -> tuple[Value]:
    args = list(node.args) + [None] * 6
    kernel = list(args[1])
    stride = list(args[2] or kernel)
    pad = list(args[3] or [0, 0])
    x = ctx.arg(args[0])
    out = node.meta["val"][0].shape
    pads = _pool_pads(x.torch_shape[2:], kernel, stride, pad, out[2:])  # ceil mode too: the far pad holds -inf
    return (_max_pool(ctx, node, x, kernel, stride, pads, out),)


def _max_pool(ctx: Lowering, node: Node, x: Value, kernel, stride, pads, out_nchw) -> Value:
    """MAX_POOL2D in NHWC (integers keep their quantization)."""
    x, pads = _explicit_pads(ctx, x, pads, counted=[0, 0, 0, 0])
    n, c, oh, ow = out_nchw
    attr = make_attr("MaxPool2dAttribute", list(kernel), list(stride), pads, NAN_PROPAGATE)
    return ctx.emit(Op.MAX_POOL2D, [x], (n, oh, ow, c), x.dtype, order=NHWC, q=x.q, attr=attr, node=node)


def _softmax_parts(ctx: Lowering, x: Value, dim: int) -> tuple[Value, Value, Value]:
    """x - max, exp(x - max) and its sum along torch dim ``dim`` (float)."""
    axis = x.tosa_dim(dim)
    reduced = list(x.shape)
    reduced[axis] = 1
    m = ctx.emit(Op.REDUCE_MAX, [x], reduced, x.dtype, like=x, attr=make_attr("ReduceMaxAttribute", axis, NAN_PROPAGATE))
    d = ctx.emit(Op.SUB, [x, m], x.shape, x.dtype, like=x)
    e = ctx.emit(Op.EXP, [d], x.shape, x.dtype, like=x)
    s = ctx.emit(Op.REDUCE_SUM, [e], reduced, x.dtype, like=x, attr=make_attr("ReduceSumAttribute", axis))
    return d, e, s


@lowers(aten._softmax.default, int=False, u55=False)
def softmax(ctx: Lowering, node: Node) -> Value:
    """exp(x - max) / sum(exp(x - max)) along one axis (float; the quantizer decomposes it for INT)."""
    x = ctx.arg(node.args[0])
    _, e, s = _softmax_parts(ctx, x, node.args[1])
    r = ctx.emit(Op.RECIPROCAL, [s], s.shape, x.dtype, like=x)
    shift = ctx.g.const(np.zeros(1, np.int8), DType.INT8)
    return ctx.emit(Op.MUL, [e, r, shift], x.shape, x.dtype, like=x, node=node)


@lowers(aten._log_softmax.default, int=False, u55=False)
def log_softmax(ctx: Lowering, node: Node) -> Value:
    """(x - max) - log(sum(exp(x - max))) along one axis (float; the quantizer decomposes it for INT)."""
    x = ctx.arg(node.args[0])
    d, _, s = _softmax_parts(ctx, x, node.args[1])
    log_s = ctx.emit(Op.LOG, [s], s.shape, x.dtype, like=x)
    return ctx.emit(Op.SUB, [d, log_s], x.shape, x.dtype, like=x, node=node)


def _upscale(node: Node) -> tuple[int, int]:
    """The integer (height, width) upscale factors of an upsample node (0 where not an integer)."""
    size = node.args[0].meta["val"].shape[2:]
    out = node.meta["val"].shape[2:]
    return tuple(int(o) // int(s) if o % s == 0 else 0 for s, o in zip(size, out))


U55_RESIZE_FACTORS = (2, 4, 8)  # the upscale factors Vela's Ethos-U55/U65 RESIZE takes (nearest only)
RESIZE_MAX_SIZE = 1024  # TOSA RESIZE's scale numerator 2 * size is at most 2048
PHASE_FACTOR_LIMIT = 63  # bilinear phases: weights 2s - d in int8, the int16 row pass exact (2s * 255 < 2**15)


def _resize_check(node: Node, spec) -> str | None:
    factors = _upscale(node)
    size, out = node.args[0].meta["val"].shape[2:], node.meta["val"].shape[2:]
    if node.args[0].meta["val"].dim() != 4 or any(o < s or o > RESIZE_MAX_SIZE for s, o in zip(size, out)):
        return f"only 2-D upsampling to at most {RESIZE_MAX_SIZE} rows and columns lowers (TOSA RESIZE)"
    if spec.is_u55_subset and not all(factors):
        return (f"the Ethos-U55/U65 TOSA subset upsamples by integer factors only (this one is {tuple(size)} to "
                f"{tuple(out)}); Ethos-U85 takes it")
    bilinear = node.target == aten.upsample_bilinear2d.vec
    if bilinear and node.args[2]:
        return "bilinear upsampling with align_corners=True has no lowering yet"
    if _by_phases(node, spec) and bilinear and max(factors) > PHASE_FACTOR_LIMIT:
        return (f"Ethos-U55/U65 bilinear upsampling runs as phases up to {PHASE_FACTOR_LIMIT}x per axis "
                f"(this one is {factors[0]}x{factors[1]})")
    return None


def _by_phases(node: Node, spec) -> bool:
    """Whether an upsampling runs as phases (Ethos-U55/U65 in INT): Vela compiles neither a bilinear TOSA RESIZE
    there (its integer form with the RESCALE after it is refused) nor a nearest one by other factors than 2, 4, 8."""
    return spec.is_u55_subset and spec.support_integer() and (
        node.target == aten.upsample_bilinear2d.vec or any(f not in U55_RESIZE_FACTORS for f in _upscale(node)))


def _resize_axis(size: int, out: int, bilinear: bool) -> tuple[int, int, int, int]:
    """TOSA RESIZE's (scale numerator, denominator, offset, border) along one axis from ``size`` to ``out``.
    An integer factor s samples at (dst + 0.5) / s - 0.5 (2s, 2, 1 - s, s - 1): torch's bilinear with
    align_corners=False, and TOSA's round-to-nearest index is torch's 'nearest' floor(dst / s). Any other ratio
    r = out / size in lowest terms p / q: bilinear samples at (dst + 0.5) / r - 0.5 (2p, 2q, q - p, p - q), and
    nearest at dst / r - 0.5 (2p, 2q, -p, p - 2q), which TOSA rounds up at .5 to torch's floor(dst / r)."""
    if out % size == 0:
        s = out // size
        return 2 * s, 2, 1 - s, s - 1
    g = math.gcd(out, size)
    p, q = out // g, size // g
    return (2 * p, 2 * q, q - p, p - q) if bilinear else (2 * p, 2 * q, -p, p - 2 * q)


def _resize(ctx: Lowering, node: Node, bilinear: bool) -> Value:
    """RESIZE by ``_resize_axis``'s parameters; integer bilinear results carry a factor of the two scale
    numerators, removed by a RESCALE. Ethos-U55/U65 in INT upsample by phases instead (``_by_phases``)."""
    x = ctx.nhwc(ctx.arg(node.args[0]))
    factors = _upscale(node)
    if _by_phases(node, ctx.spec):
        return _bilinear_phases(ctx, x, factors, node) if bilinear else _nearest_phases(ctx, x, factors, node)
    axes = [_resize_axis(int(s), int(o), bilinear)
            for s, o in zip(node.args[0].meta["val"].shape[2:], node.meta["val"].shape[2:])]
    scale = [v for a in axes for v in a[:2]]
    offset = [a[2] for a in axes]
    border = [a[3] for a in axes]
    n, c, oh, ow = node.meta["val"].shape
    integer = x.q is not None
    out_dtype = DType.INT32 if integer and bilinear else x.dtype
    mode = ts.ResizeMode.BILINEAR if bilinear else ts.ResizeMode.NEAREST
    y = ctx.emit(Op.RESIZE, [x, *(ctx.g.shape_const(v) for v in (scale, offset, border))], (n, oh, ow, c),
                 out_dtype, order=NHWC, q=x.q if out_dtype == x.dtype else None,
                 attr=make_attr("ResizeAttribute", mode), node=node)
    if out_dtype != x.dtype:
        y = ctx.rescale(y, 1.0 / (scale[0] * scale[2]), x.dtype, 0, 0, q=x.q, node=node)
    return y


def _interleave(ctx: Lowering, phases: list[Value], axis: int, node: Node) -> Value:
    """NHWC phase outputs interleaved along TOSA ``axis`` (1: rows, 2: columns): output a*s + p is phase p's a.
    Joined along the next axis (rows: side by side in W; columns: in C), the bytes are already the
    interleaved tensor, so a RESHAPE relabels them and Vela writes each phase straight into place."""
    if len(phases) == 1:
        return phases[0]
    n, h, w, c = phases[0].shape
    joined = concat(ctx, phases, axis + 1, node)
    shape = (n, h * len(phases), w, c) if axis == 1 else (n, h, w * len(phases), c)
    return ctx.relayout(joined, shape, NHWC, node)


def _nearest_phases(ctx: Lowering, x: Value, factors, node: Node) -> Value:
    """Nearest upsampling as copies: every phase of an axis is the input itself."""
    for axis, s in zip((1, 2), factors):
        x = _interleave(ctx, [x] * s, axis, node)
    return x


def _bilinear_pass(ctx: Lowering, x: Value, axis: int, s: int, out_dtype, scale: float, in_zp: int, out_zp: int,
                   q, node: Node) -> Value:
    """Bilinear upsampling by ``s`` along TOSA ``axis`` as one two-tap DEPTHWISE_CONV2D per output phase.

    Output a*s + p samples (2(a*s + p) + 1 - s) / 2s: input a + d (d = -1 or 0) weighted 2s - e, and the next
    input weighted e, e = 2p + 1 - s - 2sd, exactly TOSA RESIZE's integer weights. The edge rows are repeated
    once on each side, as RESIZE clamps its indices; the sums are RESIZE's, times 2s, rescaled by ``scale``."""
    n, h, w, c = x.shape
    size = x.shape[axis]
    edges = [slice_axis(ctx, x, axis, 0, 1), x, slice_axis(ctx, x, axis, size - 1, 1)]
    padded = concat(ctx, edges, axis, node)
    acc = accumulator(x)
    kernel = (2, 1) if axis == 1 else (1, 2)
    bias = ctx.g.const(np.zeros(c, np.int64), acc)
    zps = [ctx.g.zero_point(in_zp, x.dtype), ctx.g.zero_point(0, DType.INT8)]
    attr = make_attr("DepthwiseConv2dAttribute", [0, 0, 0, 0], [1, 1], [1, 1], False, acc)
    phases = []
    for p in range(s):
        t = 2 * p + 1 - s
        d = -1 if t < 0 else 0
        e = t - 2 * s * d
        window = slice_axis(ctx, padded, axis, d + 1, size + 1)
        weights = np.broadcast_to(np.array([2 * s - e, e], np.int8).reshape(*kernel, 1, 1), (*kernel, c, 1))
        total = ctx.emit(Op.DEPTHWISE_CONV2D, [window, ctx.g.const(np.ascontiguousarray(weights), DType.INT8), bias,
                                              *zps], (n, h, w, c), acc, order=NHWC, attr=attr, node=node)
        phases.append(ctx.rescale(total, scale, out_dtype, 0, out_zp, q=q, node=node))
    return _interleave(ctx, phases, axis, node)


def _bilinear_phases(ctx: Lowering, x: Value, factors, node: Node) -> Value:
    """Bilinear upsampling (int8) as phases, rows then columns: the row pass keeps its sums exactly in int16
    (zero point removed), the column pass rescales the full sums by 1 / (4 s_y s_x) once, as RESIZE's RESCALE
    does, so the integers equal TOSA RESIZE's."""
    passes = [(axis, s) for axis, s in zip((1, 2), factors) if s > 1]
    q, zp, divisor = x.q, x.q.zp, 1
    for i, (axis, s) in enumerate(passes):
        divisor *= 2 * s
        if i < len(passes) - 1:
            x = _bilinear_pass(ctx, x, axis, s, DType.INT16, 1.0, zp, 0, None, node)
            zp = 0
        else:
            x = _bilinear_pass(ctx, x, axis, s, DType.INT8, 1.0 / divisor, zp, q.zp, q, node)
    return x


@lowers(aten.upsample_nearest2d.vec, check=_resize_check)
def upsample_nearest2d(ctx: Lowering, node: Node) -> Value:
    return _resize(ctx, node, bilinear=False)


@lowers(aten.upsample_bilinear2d.vec, check=_resize_check)
def upsample_bilinear2d(ctx: Lowering, node: Node) -> Value:
    return _resize(ctx, node, bilinear=True)
