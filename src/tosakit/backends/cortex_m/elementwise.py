"""The Cortex-M passes for the kernels without weights: add and mul, softmax, pooling, tables of element-wise
functions, transposes, and the quantize/dequantize at the program's edges."""

from __future__ import annotations

import math

import torch
from torch.fx import GraphModule, Node

from ...capture.graph import graph_attr
from ...partition.partitioner import ABSORBS
from ...quantize.qdq import PASSTHROUGH, QParams, is_dequantize, is_quantize, qparams_of
from .ops import SOFTMAX_INPUT_BITS, multiplier_shift
from .patterns import (REPLACES, aten, clean, cm, int8_tensor, new_constant, pattern_input, pattern_output,
                       replace_pattern, same_qparams, scratch)


def add(gm: GraphModule, isa: str) -> GraphModule:
    """dq, dq -> add/sub (equal shapes, or a map and one value per channel) -> q: quantized_add, each operand
    rescaled to twice the larger scale after CMSIS-NN's 20-bit left shift."""
    for node in list(gm.graph.nodes):
        if node.target not in (aten.add.Tensor, aten.sub.Tensor) or len(node.args) != 2:
            continue
        a, b, end = pattern_input(node.args[0]), pattern_input(node.args[1]), pattern_output(node)
        alpha = node.kwargs.get("alpha", 1)
        if a is None or b is None or end is None or not isinstance(alpha, int) or not _elementwise_shapes(a[0], b[0]):
            continue
        coef = alpha if node.target == aten.add.Tensor else -alpha
        (sa, qa), (sb, qb), (out, qout, low, high) = a, b, end
        b_scale = abs(coef) * qb.s
        double = 2 * max(qa.s, b_scale)
        ma, sha = multiplier_shift(qa.s / double)
        mb, shb = multiplier_shift(b_scale / double)
        mo, sho = multiplier_shift(double / (qout.s * (1 << 20)))
        if _add_overflows(qa, qb, qa.s, b_scale * (1 if coef > 0 else -1), double, sho):
            continue
        args = (sa, qa.zp, ma, sha, sb, qb.zp, -mb if coef < 0 else mb, shb, qout.zp, mo, sho, low, high)
        replace_pattern(gm, out, cm.quantized_add.default, args)
    return clean(gm)


def _elementwise_shapes(a: Node, b: Node) -> bool:
    """Operands CMSIS-NN's element-wise kernels take: equal shapes, or a 4-D map and one value per channel."""
    x, y = a.meta["val"].shape, b.meta["val"].shape
    return x == y or (len(x) == len(y) == 4 and x[1] == y[1] and min(x.numel(), y.numel()) == x[1])


def _add_overflows(qa: QParams, qb: QParams, sa: float, sb: float, double: float, out_shift: int) -> bool:
    """Whether the kernel's int32 sum, shifted left by a positive output shift, can overflow (ExecuTorch refuses
    those adds)."""
    if out_shift <= 0:
        return False
    worst = max(abs(da * sa + db * sb) * (1 << 20) / double
                for da in (qa.qmin - qa.zp, qa.qmax - qa.zp) for db in (qb.qmin - qb.zp, qb.qmax - qb.zp))
    return worst * (1 << out_shift) >= 1 << 31


def mul(gm: GraphModule, isa: str) -> GraphModule:
    """dq, dq -> mul (equal shapes, or a map and one value per channel: a squeeze-excite gate) -> q:
    quantized_mul."""
    for node in list(gm.graph.nodes):
        if node.target != aten.mul.Tensor:
            continue
        a, b, end = pattern_input(node.args[0]), pattern_input(node.args[1]), pattern_output(node)
        if a is None or b is None or end is None or not _elementwise_shapes(a[0], b[0]) or end[2:] != (-128, 127):
            continue
        (sa, qa), (sb, qb), (out, qout, _, _) = a, b, end
        args = (sa, qa.zp, sb, qb.zp, qout.zp, *multiplier_shift(qa.s * qb.s / qout.s))
        replace_pattern(gm, out, cm.quantized_mul.default, args)
    return clean(gm)


def extrema(gm: GraphModule, isa: str) -> GraphModule:
    """dq, dq -> minimum/maximum -> q, all three with the same qparams (the quantizer shares them): the elementwise
    minimum or maximum of the integers."""
    kernels = {aten.minimum.default: cm.minimum.default, aten.maximum.default: cm.maximum.default}
    for node in list(gm.graph.nodes):
        if node.target not in kernels:
            continue
        a, b, end = pattern_input(node.args[0]), pattern_input(node.args[1]), pattern_output(node)
        if a is None or b is None or end is None or end[2:] != (-128, 127) or \
                not (same_qparams(a[1], b[1]) and same_qparams(a[1], end[1])):
            continue
        replace_pattern(gm, end[0], kernels[node.target], (a[0], b[0]))
    return clean(gm)


def div(gm: GraphModule, isa: str) -> GraphModule:
    """dq, dq -> div (equal shapes) -> q: quantized_div, which divides in float and scales the quotient by
    s_self / (s_other * s_out) (carried as a float: no fixed-point divide exists)."""
    for node in list(gm.graph.nodes):
        if node.target != aten.div.Tensor or node.kwargs.get("rounding_mode") is not None:
            continue
        a, b, end = pattern_input(node.args[0]), pattern_input(node.args[1]), pattern_output(node)
        if a is None or b is None or end is None or a[0].meta["val"].shape != b[0].meta["val"].shape or \
                end[2:] != (-128, 127):
            continue
        (sa, qa), (sb, qb), (out, qout, _, _) = a, b, end
        replace_pattern(gm, out, cm.quantized_div.default, (sa, qa.zp, sb, qb.zp, qout.zp,
                                                            float(qa.s / (qb.s * qout.s))))
    return clean(gm)


def softmax(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> softmax -> q with CMSIS-NN's fixed output (1/256, -128): cortex_m softmax, the input scale times 2**26
    as a multiplier and shift, and the smallest difference from the maximum that still counts."""
    for node in list(gm.graph.nodes):
        if node.target != aten._softmax.default or (len(node.args) > 2 and node.args[2]):
            continue
        x, end = pattern_input(node.args[0]), pattern_output(node)
        if x is None or end is None or (end[1].s, end[1].zp) != (1 / 256, -128):
            continue
        (src, q), out = x, end[0]
        real = min(q.s * (1 << (31 - SOFTMAX_INPUT_BITS)), float((1 << 31) - 1))
        mult, shift = multiplier_shift(real)
        diff_min = -math.floor(((1 << SOFTMAX_INPUT_BITS) - 1) * math.ldexp(1.0, 31 - SOFTMAX_INPUT_BITS)
                               / math.ldexp(1.0, shift))
        replace_pattern(gm, out, cm.softmax.default, (src, node.args[1], q.zp, -128, mult, shift, diff_min))
    return clean(gm)


def mean(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> mean over H and W of a 4-D map -> q (the same qparams): a whole-plane average pool (a view drops the
    1x1 plane unless keepdim)."""
    for node in list(gm.graph.nodes):
        if node.target != aten.mean.dim or node.kwargs.get("dtype") is not None:
            continue
        x, end = pattern_input(node.args[0]), pattern_output(node)
        shape = x[0].meta["val"].shape if x is not None else ()
        if end is None or len(shape) != 4 or sorted(d % 4 for d in node.args[1]) != [2, 3] or \
                not same_qparams(x[1], end[1]) or end[2:] != (-128, 127):
            continue
        (src, q), out = x, end[0]
        kernel = [int(shape[2]), int(shape[3])]
        pooled = _avg_pool(gm, out, src, q, kernel, [1, 1], [0, 0], False, isa)
        if not (len(node.args) > 2 and node.args[2]):
            pooled.meta["val"] = torch.empty(*shape[:2], 1, 1, dtype=torch.int8).contiguous(
                memory_format=torch.channels_last)
            with gm.graph.inserting_after(pooled):
                view = gm.graph.call_function(aten.view.default, (pooled, list(out.meta["val"].shape)))
            view.meta = {**out.meta}
            pooled.replace_all_uses_with(view, delete_user_cb=lambda user: user is not view)
    return clean(gm)


def avg_pool(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> avg_pool2d (no divisor override) -> q (the same qparams): quantized_avg_pool2d; a pool that counts its
    padding reads a cortex_m pad of the zero point first (ExecuTorch pads so even with zero padding)."""
    for node in list(gm.graph.nodes):
        if node.target != aten.avg_pool2d.default:
            continue
        args = list(node.args) + [None] * (7 - len(node.args))
        kernel, stride, padding, ceil_mode, include_pad, divisor = args[1:7]
        x, end = pattern_input(args[0]), pattern_output(node)
        if x is None or end is None or divisor is not None or not same_qparams(x[1], end[1]) or \
                end[2:] != (-128, 127):
            continue
        (src, q), out = x, end[0]
        padding = list(padding or [0, 0])
        if include_pad is None or include_pad:
            physical = [0, padding[0], padding[1], 0]
            with gm.graph.inserting_before(out):
                src_padded = gm.graph.call_function(cm.pad.default, (src, physical, physical, q.zp))
            val = src.meta["val"]
            src_padded.meta["val"] = torch.empty(val.shape[0], val.shape[1], val.shape[2] + 2 * padding[0],
                                                 val.shape[3] + 2 * padding[1], dtype=torch.int8).contiguous(
                memory_format=torch.channels_last)
            src, padding = src_padded, [0, 0]
        _avg_pool(gm, out, src, q, list(kernel), list(stride or kernel), padding, bool(ceil_mode), isa)
    return clean(gm)


def _avg_pool(gm: GraphModule, out: Node, src: Node, q: QParams, kernel, stride, padding, ceil_mode: bool,
              isa: str) -> Node:
    channels = int(src.meta["val"].shape[1])
    args = (src, kernel, stride, padding, ceil_mode, q.zp, *multiplier_shift(q.s),
            scratch(gm, 4 * channels if isa == "DSP" else 0, out))
    return replace_pattern(gm, out, cm.quantized_avg_pool2d.default, args)


def max_pool(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> max_pool2d (its values; no dilation, no ceil mode) -> [relu/clamp] -> q (the same scale and zero
    point): quantized_max_pool2d."""
    for node in list(gm.graph.nodes):
        if node.target != aten.max_pool2d_with_indices.default or len(node.users) != 1:
            continue
        values = next(iter(node.users))
        args = list(node.args) + [None] * (6 - len(node.args))
        kernel, stride, padding, dilation, ceil_mode = args[1:6]
        x, end = pattern_input(args[0]), pattern_output(values) if values.args[1] == 0 else None
        if x is None or end is None or list(dilation or [1, 1]) != [1, 1] or ceil_mode or \
                not same_qparams(x[1], end[1]):
            continue
        (src, q), (out, _, low, high) = x, end
        args = (src, list(kernel), list(stride or kernel), list(padding or [0, 0]), [1, 1], False, q.zp, q.zp, low,
                high)
        replace_pattern(gm, out, cm.quantized_max_pool2d.default, args)
    return clean(gm)


# Element-wise ops a table can hold (their other operands numbers): what quantize(f(dequantize(x))) computes for
# each of the 256 int8 values.
ELEMENTWISE = {aten.add.Tensor, aten.add.Scalar, aten.sub.Tensor, aten.sub.Scalar, aten.mul.Tensor, aten.mul.Scalar,
               aten.div.Tensor, aten.div.Scalar, aten.clamp.default, aten.clamp_min.default, aten.clamp_max.default,
               aten.relu.default, aten.hardtanh.default, aten.hardswish.default, aten.hardsigmoid.default,
               aten.sigmoid.default, aten.tanh.default, aten.exp.default, aten.log.default, aten.gelu.default,
               aten.silu.default, aten.neg.default, aten.abs.default, aten.sqrt.default, aten.rsqrt.default,
               aten.reciprocal.default, aten.erf.default, aten.leaky_relu.default, aten.elu.default,
               aten.pow.Tensor_Scalar, aten.minimum.default, aten.maximum.default}
MAX_TABLE_OPS = 16


MAX_TABLE_OPS = 16


def _scalar_constant(gm: GraphModule, node: Node) -> torch.Tensor | None:
    """The real value of a dequantized one-element constant (``x * 0.5`` quantizes its 0.5), else None."""
    if not (is_dequantize(node) and isinstance(node.args[0], Node) and node.args[0].op == "get_attr"):
        return None
    value = graph_attr(gm, node.args[0])
    return qparams_of(node, gm).dequantize(value, torch.float64) if value.numel() == 1 else None


def _function_of_one_input(gm: GraphModule, out: Node) -> tuple[list[Node], dict, tuple] | None:
    """The element-wise ops between quantize ``out`` and the dequantizes of one int8 tensor (all with the same
    qparams) that feed them (besides one-element constants), in graph order; the leaves' values for the 256 int8
    inputs; that tensor and its qparams. None unless every value the ops make is read inside."""
    ops, leaves, stack = [], [], [out.args[0]]
    while stack:
        node = stack.pop()
        if node in ops or node in leaves:
            continue
        if not isinstance(node, Node):
            return None
        if is_dequantize(node):
            leaves.append(node)
            continue
        if node.op != "call_function" or node.target not in ELEMENTWISE or len(ops) >= MAX_TABLE_OPS:
            return None
        ops.append(node)
        stack += [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, Node)]
    constants = {d: _scalar_constant(gm, d) for d in leaves}
    variable = [d for d in leaves if constants[d] is None]
    found = [pattern_input(d) for d in variable]
    sources = {(f[0], f[1].s, f[1].zp) if f else None for f in found}
    inside = set(ops) | {out}
    if not ops or len(sources) != 1 or None in sources or any(set(n.users) - inside for n in ops) or \
            any(set(d.users) - inside for d in variable):
        return None
    source = pattern_input(variable[0])
    every_int8 = source[1].dequantize(torch.arange(-128, 128, dtype=torch.int8), torch.float64)
    values = {d: every_int8 if constants[d] is None else constants[d] for d in leaves}
    order = {n: k for k, n in enumerate(out.graph.nodes)}
    return sorted(ops, key=order.get), values, source


def table(gm: GraphModule, isa: str) -> GraphModule:
    """An int8 -> int8 chain of element-wise ops (hardswish as torch decomposes it, sigmoid, GELU, ...):
    quantized_activation with its 256 outputs, computed as the fake-quantized model computes them (float64 between
    the dequantize and the quantize)."""
    for out in list(gm.graph.nodes):
        q = int8_tensor(out) if is_quantize(out) else None
        found = _function_of_one_input(gm, out) if q is not None else None
        if found is None:
            continue
        ops, values, (src, _) = found
        for node in ops:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: values[a])
            values[node] = node.target(*args, **kwargs).to(torch.float64)
        lut = q.quantize(values[out.args[0]])
        replace_pattern(gm, out, cm.quantized_activation.default,
                        (src, new_constant(gm, f"_cortex_m_{out.name}_lut", lut.to(torch.int8), out)))
    return clean(gm)


def passthrough(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> a data-movement op (view, permute, ...) -> q with the same qparams: the op on the integers."""
    for node in list(gm.graph.nodes):
        src = node.args[0] if node.target in PASSTHROUGH and node.args else None
        if pattern_input(src) is None or len(node.users) != 1:
            continue
        (x, qin), out = pattern_input(src), next(iter(node.users))
        qout = int8_tensor(out)
        if qout is None or (qout.s, qout.zp) != (qin.s, qin.zp):
            continue
        node.replace_input_with(src, x)
        node.meta.update(val=out.meta["val"], **{REPLACES: out.name, ABSORBS: [src.name, out.name]})
        out.replace_all_uses_with(node)
    return clean(gm)


def transpose(gm: GraphModule, isa: str) -> GraphModule:
    """A permute of int8 values (left by passthrough between a dequantize and a quantize): cortex_m transpose."""
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.target == aten.permute.default and isinstance(val, torch.Tensor) and val.dtype == torch.int8:
            node.target, node.args = cm.transpose.default, (node.args[0], [d % val.dim() for d in node.args[1]])
    gm.recompile()
    return gm


def boundaries(gm: GraphModule, isa: str) -> GraphModule:
    """The per-tensor int8 quantize/dequantize left (at the program's edges, around portable kernels):
    cortex_m's, with the same arguments."""
    swap = {torch.ops.quantized_decomposed.quantize_per_tensor.default: cm.quantize_per_tensor.default,
            torch.ops.quantized_decomposed.dequantize_per_tensor.default: cm.dequantize_per_tensor.default}
    for node in gm.graph.nodes:
        if node.target in swap and int8_tensor(node) is not None:
            node.target = swap[node.target]
    gm.recompile()
    return gm
