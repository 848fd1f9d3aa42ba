"""Convolution and linear layers: CONV2D / DEPTHWISE_CONV2D / TRANSPOSE_CONV2D, with int32 accumulators
in INT; grouped convolution runs one CONV2D per group and a CONCAT; on Ethos-U55/U65 a transposed convolution
runs as stride-1 CONV2Ds, one per row phase (``subpixel``)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.fx import Node

from ...quantize.qdq import QParams
from ..lowering import Lowering, accumulator, is_constant, int_dtype, lowers, make_attr, tosa_pads
from ..subpixel import AxisPhases, row_phase_weights
from ..tosa_graph import NHWC, DType, Op, TosaGraph, Value
from ..transpose import SWAPPABLE, TransposeCase, emit_transpose, transpose_case

aten = torch.ops.aten


def _conv_check(node: Node, spec) -> str | None:
    x, w = node.args[0], node.args[1]
    if not is_constant(w):
        return "convolution weights must be constants"
    rank = x.meta["val"].dim()
    if node.args[6]:
        return _transposed_check(node, rank)
    if rank not in (3, 4):
        return f"only 1-D and 2-D convolution are lowered (input rank {rank})"
    return None


def _transposed_check(node: Node, rank: int) -> str | None:
    dilation, groups = node.args[5], node.args[8]
    if rank != 4:
        return f"only 2-D transposed convolution is lowered (input rank {rank})"
    if groups != 1:
        return f"transposed convolution with groups={groups} has no lowering; TRANSPOSE_CONV2D has no groups"
    if any(d != 1 for d in dilation):
        return f"transposed convolution with dilation {list(dilation)}: TRANSPOSE_CONV2D has no dilation"
    return None


def _weight_check(node: Node, spec) -> str | None:
    return None if is_constant(node.args[1]) else "linear weights must be constants"


def _requant(ctx: Lowering, acc: Value, in_scale: float, w_scale, node: Node) -> Value:
    """The accumulator (int32, or int48 for int16 activations) -> output integers, with any fused clamp."""
    q_out: QParams = ctx.q_of(node)
    scales = in_scale * np.atleast_1d(np.asarray(w_scale, dtype=np.float64)) / q_out.s
    out = ctx.rescale(acc, scales if scales.size > 1 else float(scales[0]), int_dtype(q_out), 0, q_out.zp,
                      q=q_out, node=node)
    return ctx.fused_clamp(out, node)


def _bias(ctx: Lowering, b: torch.Tensor | None, oc: int, in_scale: float | None, w_scale, acc=DType.INT32) -> str:
    """The bias tensor in the accumulator's type: integers quantized with in_scale x weight scale (int32,
    or int48 beside int16 activations), float in FP."""
    if in_scale is None:
        arr = np.zeros(oc, np.float32) if b is None else b.float().numpy()
        return ctx.g.const(arr, DType.FP32)
    if b is None:
        values = np.zeros(oc, np.int64)
    elif b.dtype == torch.int32:  # already quantized by the quantizer (scale = input x weight)
        values = b.numpy().astype(np.int64)
    else:
        scale = in_scale * np.broadcast_to(np.asarray(w_scale, dtype=np.float64), (oc,))
        values = np.clip(np.round(b.double().numpy() / scale), -(2**31), 2**31 - 1).astype(np.int64)
    return ctx.g.const(values, acc)


def _weight_scale(node: Node, lo: int, hi: int):
    """The weight scale of output channels [lo, hi) (a float when per tensor); None in FP."""
    q_w: QParams | None = node.args[1].meta.get("tosakit_q")
    if q_w is None:
        return None
    return q_w.scale if not q_w.per_channel else np.asarray(q_w.scale)[lo:hi]


def weight_dtype(integer: bool):
    """int8 weights in INT, float weights in FP."""
    return DType.INT8 if integer else DType.FP32


def _weight_storage(ctx: Lowering, node: Node, integer: bool):
    """The weights' TOSA type: INT4 (two to a byte) when they were quantized to -8..7 (a8w4) and the target has
    TOSA's int4 extension, as Vela 5.2 reads them for Ethos-U55/U65/U85 (the weight zero point INT4 too);
    else ``weight_dtype``."""
    q: QParams | None = node.args[1].meta.get("tosakit_q") if integer and len(node.args) > 1 and \
        isinstance(node.args[1], Node) else None
    if q is not None and q.qmin >= -8 and q.qmax <= 7 and ctx.spec.support_extension("int4"):
        return DType.INT4
    return weight_dtype(integer)


def slice_axis(ctx: Lowering, v: Value, axis: int, start: int, size: int) -> Value:
    """SLICE ``size`` entries from ``start`` along TOSA dimension ``axis``."""
    begin = [0] * v.rank
    shape = list(v.shape)
    begin[axis], shape[axis] = start, size
    return ctx.emit(Op.SLICE, [v, ctx.g.shape_const(begin), ctx.g.shape_const(shape)], shape, v.dtype, like=v,
                    q=v.q, attr=make_attr("SliceAttribute"))


def concat(ctx: Lowering, vals: list[Value], axis: int, node: Node | None = None) -> Value:
    """CONCAT values of one layout along TOSA dimension ``axis``."""
    shape = list(vals[0].shape)
    shape[axis] = sum(v.shape[axis] for v in vals)
    return ctx.emit(Op.CONCAT, vals, shape, vals[0].dtype, like=vals[0], q=vals[0].q,
                    attr=make_attr("ConcatAttribute", axis), node=node)


@dataclass(frozen=True)
class StemCase:
    """A stride-2 convolution over few channels (an image network's first layer) on an NHWC ``[1, H, W, C]``
    input. Its ``space_to_depth`` form swaps each 2x2 patch into channels ([H/2, W/2, 4C]) and runs a
    stride-1 convolution with the weights rearranged (zeros where the patch falls outside the kernel): the
    same sums, so the same integers, with 4x deeper input that fills the NPU's MACs (ResNet-18's 7x7 stem on
    Ethos-U55: 2.61 M -> 1.66 M cycles, the swap included)."""

    in_shape: tuple[int, int, int, int]
    kernel: tuple[int, int]
    out_channels: int
    pads: tuple[int, int, int, int]  # TOSA pads of the stride-2 convolution
    dtype: object

    @property
    def swap(self) -> TransposeCase:
        """[Y, dy, (X dx c)] -> [Y, (X dx c), dy]: the patches as channels, in (dx, c, dy) order."""
        _, h, w, c = self.in_shape
        return transpose_case((1, h // 2, 2, w * c), (0, 1, 3, 2), self.dtype)

    @property
    def forms(self) -> tuple[str, ...]:
        return ("conv", *(f"space_to_depth+{f}" for f in self.swap.forms))

    def stem_pads(self) -> list[int]:
        """The stride-1 convolution's pads (each side's patches of padding), and its kernel size, per axis."""
        out = []
        for (top, bottom), k, size in zip((self.pads[:2], self.pads[2:]), self.kernel, self.in_shape[1:3]):
            k2 = (k - 1 - top) // 2 + (top + 1) // 2 + 1
            top2 = (top + 1) // 2
            span = size - 1 + top + bottom - (k - 1)  # the stride-2 output is span // 2 + 1 rows
            out += [top2, span // 2 + 1 - size // 2 - top2 + k2 - 1, k2]
        return out

    def weights(self, w: np.ndarray) -> np.ndarray:
        """OHWI weights of the stride-2 convolution rearranged for the stride-1 one over patches."""
        oc, k_h, k_w, c = w.shape
        top, _, kh2, left, _, kw2 = self.stem_pads()
        out = np.zeros((oc, kh2, kw2, 2, c, 2), w.dtype)  # channel order (dx, c, dy)
        for ky in range(kh2):
            for dy in range(2):
                kh = 2 * ky + dy - 2 * top + self.pads[0]
                for kx in range(kw2):
                    for dx in range(2):
                        kw = 2 * kx + dx - 2 * left + self.pads[2]
                        if 0 <= kh < k_h and 0 <= kw < k_w:
                            out[:, ky, kx, dx, :, dy] = w[:, kh, kw, :]
        return out.reshape(oc, kh2, kw2, 4 * c)

    def applies(self) -> bool:
        """Patches need no negative padding; the stride-2 convolution's far pads may be negative (rows its
        windows never reach: the plain form crops them, the patches' convolution just does not reach them)."""
        top, bottom, _, left, right, _ = self.stem_pads()
        return min(top, bottom, left, right, self.pads[0], self.pads[2]) >= 0

    def candidate(self, form: str) -> bytes:
        """The convolution alone in ``form`` (seeded weights, a unit requantization), for measuring."""
        g = TosaGraph()
        cropped = form == "conv" and min(self.pads) < 0  # the rows and columns no window reaches, cropped
        _, h, wd, c = self.in_shape
        shape = (1, h + min(self.pads[1], 0), wd + min(self.pads[3], 0), c) if cropped else self.in_shape
        x = g.input(shape, self.dtype)
        w = np.random.default_rng(0).integers(-127, 128, (self.out_channels, *self.kernel, c))
        acc = DType.INT32 if self.dtype == DType.INT8 else DType.INT48
        zps = [g.zero_point(0, self.dtype), g.zero_point(0, DType.INT8)]
        x, w, pads, stride = emit_stem(g, x, self, form, w.astype(np.int8))
        pads = [max(p, 0) for p in pads]
        out = [1, (self.in_shape[1] + self.pads[0] + self.pads[1] - self.kernel[0]) // 2 + 1,
               (self.in_shape[2] + self.pads[2] + self.pads[3] - self.kernel[1]) // 2 + 1, self.out_channels]
        y = g.op(Op.CONV2D, [x, g.const(w, DType.INT8), g.const(np.zeros(self.out_channels), acc), *zps], out, acc,
                 make_attr("Conv2dAttribute", pads, stride, [1, 1], False, acc))
        g.output(g.rescale(y, 1 / 1024, self.dtype))
        return g.serialize()


def emit_stem(g: TosaGraph, x: str, case: StemCase, form: str, w: np.ndarray, location: str | None = None):
    """The stem's input, OHWI weights, pads and stride in ``form`` (the swap emitted when it is space-to-depth)."""
    if form == "conv":
        return x, w, list(case.pads), [2, 2]
    _, h, wd, c = case.in_shape
    x = emit_transpose(g, x, case.swap, form.split("+")[1], location, out_shape=[1, h // 2, wd // 2, 4 * c])
    top, bottom, _, left, right, _ = case.stem_pads()
    return x, case.weights(w), [top, bottom, left, right], [1, 1]


def _stem_case(x: Value, w: torch.Tensor, stride, pads, dilation, integer: bool) -> StemCase | None:
    """The space-to-depth choice for a stride-2 convolution over at most 4 integer channels, when it applies."""
    n, h, wd, c = x.shape
    if not integer or x.dtype not in SWAPPABLE or tuple(stride) != (2, 2) or tuple(dilation) != (1, 1):
        return None
    if n != 1 or c > 4 or h % 2 or wd % 2 or max(w.shape[2:]) < 2:
        return None
    case = StemCase((1, h, wd, c), tuple(w.shape[2:]), w.shape[0], tuple(pads), x.dtype)
    return case if case.applies() else None


_ATTRIBUTES = {Op.CONV2D: "Conv2dAttribute", Op.DEPTHWISE_CONV2D: "DepthwiseConv2dAttribute",
               Op.TRANSPOSE_CONV2D: "TransposeConv2dAttribute"}


def _emit_conv(ctx: Lowering, node: Node, op, x: Value, w_np: np.ndarray, b: torch.Tensor | None, w_scale,
               window: list, out_shape) -> Value:
    """One convolution ``op`` on NHWC ``x``: weights in the op's layout, its window attribute (pads, stride and
    dilation as the op has them), the bias in the accumulator; the result requantized in INT, clamped if fused."""
    integer = w_scale is not None
    storage = _weight_storage(ctx, node, integer)
    weight = ctx.g.const(np.ascontiguousarray(w_np), storage)
    acc_type = accumulator(x) if integer else DType.FP32
    bias = _bias(ctx, b, out_shape[-1], x.q.s if integer else None, w_scale, acc_type)
    zps = [ctx.g.zero_point(x.q.zp if integer else 0, x.dtype), ctx.g.zero_point(0, storage)]
    attr = make_attr(_ATTRIBUTES[op], *window, False, acc_type)
    acc = ctx.emit(op, [x, weight, bias, *zps], out_shape, acc_type, order=NHWC, attr=attr, node=node)
    if integer:
        return _requant(ctx, acc, x.q.s, w_scale, node)
    return ctx.fused_clamp(acc, node)


def _out_size(size: int, k: int, s: int, d: int, before: int, after: int) -> int:
    """Outputs along one axis of a window of ``k`` taps, stride ``s``, dilation ``d``, TOSA padding."""
    return (size + before + after - (k - 1) * d - 1) // s + 1


def _live_taps(size: int, k: int, s: int, d: int, before: int, after: int) -> tuple[int, int]:
    """(first, last) kernel tap along one axis that reads the input at some output; the rest read padding only."""
    out = _out_size(size, k, s, d, before, after)
    starts = np.arange(out) * s - before
    live = [t for t in range(k) if np.any((starts + t * d >= 0) & (starts + t * d < size))]
    return (live[0], live[-1]) if live else (0, k - 1)


def _drop_dead_taps(ctx: Lowering, x: Value, w: torch.Tensor, pads: list[int], stride, dilation):
    """Kernel taps that read only padding, dropped: a dilated kernel wider than its input (DeepLabV3's ASPP at
    rates 24 and 36 on a 14x14 map) keeps its centre alone, the same sums without the zero-stuffed 49- or 73-wide
    kernel Vela would run for it. Returns the input (cropped where the first live tap starts inside it), the
    OIHW weights, TOSA pads and dilation."""
    pads, dilation = list(pads), list(dilation)
    for axis in (0, 1):
        k, d, size = w.shape[2 + axis], dilation[axis], x.shape[1 + axis]
        before, after = pads[2 * axis], pads[2 * axis + 1]
        first, last = _live_taps(size, k, stride[axis], d, before, after)
        if (first, last) == (0, k - 1):
            continue
        w = w.narrow(2 + axis, first, last - first + 1)
        before, after = before - first * d, after - (k - 1 - last) * d
        if before < 0:  # the first live tap starts inside the input: the rows before it are never read
            x = slice_axis(ctx, x, 1 + axis, -before, size + before)
            before = 0
        pads[2 * axis], pads[2 * axis + 1] = before, after
        dilation[axis] = d if last > first else 1
    return x, w, pads, dilation


NATIVE_DILATION = 2  # the largest dilation the Ethos-U NPUs run; Vela zero-stuffs larger kernels


def _by_regions(k: int, stride: int, d: int) -> bool:
    """Whether an axis of a convolution runs as regions (see _dilated_regions)."""
    return k > 1 and stride == 1 and d > NATIVE_DILATION


def _tap_runs(size: int, k: int, d: int, before: int, after: int) -> list[tuple[int, int, int, int]] | None:
    """Along one stride-1 axis: (first, stop) output runs that read the same live taps (first, last); None when
    some output reads padding only (its bias alone: left to the dilated form)."""
    out = _out_size(size, k, 1, d, before, after)
    runs = []
    for i in range(out):
        live = [t for t in range(k) if 0 <= i + t * d - before < size]
        if not live:
            return None
        if runs and runs[-1][2:] == (live[0], live[-1]):
            runs[-1] = (runs[-1][0], i + 1, live[0], live[-1])
        else:
            runs.append((i, i + 1, live[0], live[-1]))
    return runs


def _dilated_regions(ctx: Lowering, node: Node, x: Value, w: torch.Tensor, b: torch.Tensor | None, w_scale, pads,
                     stride, dilation, runs) -> Value:
    """A CONV2D dilated past what the NPU runs, as one undilated CONV2D per output region: along each such axis
    the outputs split into ``runs`` that read the same live taps, and a region's live taps become input channels
    (the input slices each tap reads, joined along C; their weights likewise), so every product is one the
    dilated kernel forms and no zero is multiplied. DeepLabV3's rate-12 ASPP branch on a 14x14 map: nine 1x1
    convolutions of 1 to 4 taps each, where Vela would run a zero-stuffed 25x25 kernel."""
    n, _, _, cin = x.shape
    oc = w.shape[0]
    axes = []
    for a in (0, 1):  # an axis without runs is kept whole: the kernel, padding and dilation of the convolution
        k, size, before, after = w.shape[2 + a], x.shape[1 + a], pads[2 * a], pads[2 * a + 1]
        axes.append(runs[a] or [(None, _out_size(size, k, stride[a], dilation[a], before, after), None, None)])
    rows = []
    for r0, r1, a0, a1 in axes[0]:
        cols = []
        for c0, c1, b0, b1 in axes[1]:
            pieces, taps = [], []
            for th in ([None] if r0 is None else range(a0, a1 + 1)):
                for tw in ([None] if c0 is None else range(b0, b1 + 1)):
                    start, size = [0, 0, 0, 0], [n, *x.shape[1:3], cin]
                    for a, (t, lo, hi) in enumerate(((th, r0, r1), (tw, c0, c1))):
                        if t is not None:
                            start[1 + a], size[1 + a] = lo + t * dilation[a] - pads[2 * a], hi - lo
                    pieces.append(x if size == list(x.shape) else ctx.slice(x, start, size))
                    taps.append(w[:, :, slice(None) if th is None else slice(th, th + 1),
                                  slice(None) if tw is None else slice(tw, tw + 1)])
            region_pads = [p if r0 is None else 0 for p in pads[:2]] + [p if c0 is None else 0 for p in pads[2:]]
            region_dilation = [1 if r0 is not None else dilation[0], 1 if c0 is not None else dilation[1]]
            joined = pieces[0] if len(pieces) == 1 else concat(ctx, pieces, 3, node)
            w_np = torch.cat(taps, dim=1).numpy().transpose(0, 2, 3, 1)
            out_hw = (r1 if r0 is None else r1 - r0, c1 if c0 is None else c1 - c0)
            cols.append(_emit_conv(ctx, node, Op.CONV2D, joined, w_np, b, w_scale,
                                   [region_pads, list(stride), region_dilation], (n, *out_hw, oc)))
        rows.append(cols[0] if len(cols) == 1 else concat(ctx, cols, 2, node))
    return rows[0] if len(rows) == 1 else concat(ctx, rows, 1, node)


def _conv_op(ctx: Lowering, node: Node, x: Value, w: torch.Tensor, b: torch.Tensor | None, w_scale, stride, pad,
             dilation, depthwise: bool, out_hw, whole: bool = True) -> Value:
    """One CONV2D or DEPTHWISE_CONV2D on an NHWC value; returns the NHWC result (requantized in INT). ``whole``:
    its input is a whole tensor, not one group's channels (a SLICE Vela reads in place, unless space-to-depth
    rearranges it first: the stem's form is for whole inputs only)."""
    integer = w_scale is not None
    pads = tosa_pads(x.shape[1:3], w.shape[2:], stride, pad, dilation)
    x, w, pads, dilation = _drop_dead_taps(ctx, x, w, pads, stride, dilation)
    runs = [_tap_runs(x.shape[1 + a], w.shape[2 + a], dilation[a], pads[2 * a], pads[2 * a + 1])
            if _by_regions(w.shape[2 + a], stride[a], dilation[a]) else [] for a in (0, 1)]
    if not depthwise and integer and any(runs) and None not in runs:
        return _dilated_regions(ctx, node, x, w, b, w_scale, pads, stride, dilation, runs)
    n, ih, iw, cin = x.shape
    oc, _, kh, kw = w.shape
    w_np = w.numpy()
    if depthwise:  # [C*M, 1, KH, KW] -> [KH, KW, C, M]
        w_np = w_np.reshape(cin, oc // cin, kh, kw).transpose(2, 3, 0, 1)
    else:  # OIHW -> OHWI
        w_np = w_np.transpose(0, 2, 3, 1)
    stem = None if depthwise or not whole else _stem_case(x, w, stride, pads, dilation, integer)
    if stem is not None:
        form = ctx.form_of(stem)
        loc = ctx.current.name if ctx.current is not None else None
        name, w_np, pads, stride = emit_stem(ctx.g, x.name, stem, form, w_np, loc)
        if form != "conv":  # the input is now the patches, [1, H/2, W/2, 4C]
            x = Value(name, (n, ih // 2, iw // 2, 4 * cin), x.dtype, NHWC, x.q)
    op = Op.DEPTHWISE_CONV2D if depthwise else Op.CONV2D
    return _emit_conv(ctx, node, op, x, w_np, b, w_scale, [pads, list(stride), list(dilation)], (n, *out_hw, oc))


def _conv2d(ctx: Lowering, node: Node, x: Value, w: torch.Tensor, b: torch.Tensor | None, stride, pad, dilation,
            groups, out_nchw: tuple[int, ...]) -> Value:
    """A 2-D convolution on an NHWC value: one op, or one CONV2D per group joined by CONCAT."""
    x = ctx.nhwc(x)
    cin, oc = x.shape[3], w.shape[0]
    args = (stride, pad, dilation)
    if groups == 1 or groups == cin:
        return _conv_op(ctx, node, x, w, b, _weight_scale(node, 0, oc), *args, groups > 1, out_nchw[2:])
    ic_g, oc_g = cin // groups, oc // groups
    parts = []
    for g in range(groups):
        lo, hi = g * oc_g, (g + 1) * oc_g
        xg = slice_axis(ctx, x, 3, g * ic_g, ic_g)
        bg = None if b is None else b[lo:hi]
        parts.append(_conv_op(ctx, node, xg, w[lo:hi], bg, _weight_scale(node, lo, hi), *args, False, out_nchw[2:],
                              whole=False))
    return concat(ctx, parts, 3, node=node)


def _bias_tensor(ctx: Lowering, b_node) -> torch.Tensor | None:
    return None if b_node is None else ctx.constant(b_node)


def _transpose_conv2d(ctx: Lowering, node: Node, x: Value, w: torch.Tensor, b: torch.Tensor | None, stride, pad,
                      output_padding, out_nchw) -> Value:
    """TRANSPOSE_CONV2D: torch's padding crops both sides, output_padding extends the far side. On Ethos-U55/U65
    the sub-pixel form instead, at every stride: Vela takes TRANSPOSE_CONV2D there at 1x1 and 2x2 only, and runs
    the stride-1 CONV2Ds 5 to 20 times faster even then (ethos-u55-128, int8: 16->16 channels, kernel 3, stride 2
    on 16x16, 165,771 cycles as TRANSPOSE_CONV2D, 19,360 as phases)."""
    x = ctx.nhwc(x)
    if ctx.spec.is_u55_subset:
        return _transpose_conv_phases(ctx, node, x, w, b, stride, pad, out_nchw)
    oc = w.shape[1]
    out_pad = [-pad[0], -pad[0] + output_padding[0], -pad[1], -pad[1] + output_padding[1]]
    shape = (out_nchw[0], out_nchw[2], out_nchw[3], oc)
    return _emit_conv(ctx, node, Op.TRANSPOSE_CONV2D, x, w.numpy().transpose(1, 2, 3, 0), b,  # IOHW -> OHWI
                      _weight_scale(node, 0, oc), [out_pad, list(stride)], shape)


def _transpose_conv_phases(ctx: Lowering, node: Node, x: Value, w: torch.Tensor, b: torch.Tensor | None, stride,
                           pad, out_nchw) -> Value:
    """A transposed convolution as one stride-1 CONV2D per row phase, each computing every column phase as
    channels, joined by ``_interleave``: the same accumulators and RESCALE as TRANSPOSE_CONV2D."""
    rows = AxisPhases(x.shape[1], w.shape[2], stride[0], pad[0], out_nchw[2])
    cols = AxisPhases(x.shape[2], w.shape[3], stride[1], pad[1], out_nchw[3])
    parts = [_row_phase(ctx, node, x, w, b, rows, cols, py) for py in range(rows.stride)]
    return _interleave(ctx, node, parts, rows, cols, w.shape[1])


def _row_phase(ctx: Lowering, node: Node, x: Value, w: torch.Tensor, b: torch.Tensor | None, rows: AxisPhases,
               cols: AxisPhases, phase: int) -> Value:
    """Row ``phase`` of the output, [N, rows.steps, cols.steps, cols.stride x C]: a stride-1 CONV2D over the input
    rows and columns it reads (a SLICE when that is not all of them)."""
    n, _, _, cin = x.shape
    (top, height, pad_top, pad_bottom), (left, width, pad_left, pad_right) = (
        rows.crop(rows.window([phase])), cols.crop(cols.window(range(cols.stride))))
    if (height, width) != x.shape[1:3]:
        x = ctx.slice(x, [0, top, left, 0], [n, height, width, cin])
    w_scale = _weight_scale(node, 0, w.shape[1])
    if np.size(w_scale) > 1:  # per channel: the same scales for each column phase
        w_scale = np.tile(w_scale, cols.stride)
    bias = None if b is None else b.repeat(cols.stride)
    shape = (n, rows.steps, cols.steps, cols.stride * w.shape[1])
    return _emit_conv(ctx, node, Op.CONV2D, x, row_phase_weights(w.numpy(), rows, cols, phase), bias, w_scale,
                      [[pad_top, pad_bottom, pad_left, pad_right], [1, 1], [1, 1]], shape)


def _interleave(ctx: Lowering, node: Node, parts: list[Value], rows: AxisPhases, cols: AxisPhases, oc: int) -> Value:
    """The row phases' [N, A, B, sx*C] results (column phases side by side in the channels) as the NHWC output:
    CONCAT along W, which Vela writes in place, gives [N, A, sy*B, sx*C], the bytes of [N, A*sy, B*sx, C]; a SLICE
    drops what the last phases computed past the output."""
    n, a, b, _ = parts[0].shape
    joined = parts[0] if len(parts) == 1 else concat(ctx, parts, 2, node)
    y = ctx.relayout(joined, (n, a * rows.stride, b * cols.stride, oc), NHWC, node)
    if (rows.out, cols.out) == y.shape[1:3]:
        return y
    return ctx.slice(y, [0, 0, 0, 0], [n, rows.out, cols.out, oc])


@lowers(aten.convolution.default, int16=True, check=_conv_check)
def convolution(ctx: Lowering, node: Node) -> Value:
    x_node, w_node, b_node, stride, pad, dilation, transposed, output_padding, groups = node.args
    x = ctx.arg(x_node)
    w = ctx.constant(w_node)
    b = _bias_tensor(ctx, b_node)
    out = tuple(node.meta["val"].shape)
    if transposed:
        return _transpose_conv2d(ctx, node, x, w, b, tuple(stride), tuple(pad), tuple(output_padding), out)
    if x.rank == 3:  # conv1d: [N, C, L] as [N, C, 1, L]
        n, c, length = x.torch_shape
        x4 = ctx.view(x, (n, c, 1, length))
        y = _conv2d(ctx, node, x4, w.unsqueeze(2), b, (1, stride[0]), (0, pad[0]), (1, dilation[0]), groups,
                    (out[0], out[1], 1, out[2]))
        return ctx.view(y, out, node)
    return _conv2d(ctx, node, x, w, b, tuple(stride), tuple(pad), tuple(dilation), groups, out)


@lowers(aten.linear.default, int16=True, check=_weight_check)
def linear(ctx: Lowering, node: Node) -> Value:
    """A 1x1 CONV2D over [rows, 1, 1, in_features]: the form Vela runs as a fully connected layer."""
    x_node, w_node = node.args[0], node.args[1]
    b_node = node.args[2] if len(node.args) > 2 else None
    x = ctx.arg(x_node)
    w = ctx.constant(w_node)
    shape = x.torch_shape
    rows = int(np.prod(shape[:-1]))
    x4 = ctx.view(x, (rows, shape[-1], 1, 1))  # NCHW view so the NHWC form is [rows, 1, 1, in]
    out = tuple(node.meta["val"].shape)
    y = _conv2d(ctx, node, x4, w.reshape(w.shape[0], w.shape[1], 1, 1), _bias_tensor(ctx, b_node), (1, 1), (0, 0),
                (1, 1), 1, (rows, w.shape[0], 1, 1))
    return ctx.view(y, out, node)
