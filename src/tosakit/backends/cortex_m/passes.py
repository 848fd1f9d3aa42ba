"""The Cortex-M flow's passes: each quantized pattern (dequantize -> op [-> relu/clamp] -> quantize) that a CMSIS-NN
kernel computes becomes one ``cortex_m::`` call with ExecuTorch 1.5.1's integer arguments; the quantize/dequantize
left at the program's edges become ``cortex_m::`` ones. Anything else stays a portable kernel. ``pipeline(isa)``
is the list, in order."""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.fx import GraphModule, Node

from ...capture.graph import graph_attr
from ...quantize.qdq import PASSTHROUGH, QParams, is_dequantize, is_quantize, qparams_of
from .ops import multiplier_shift, scratch_buffer
from .scratch import conv_scratch, depthwise_scratch, transpose_conv_scratch

aten = torch.ops.aten
cm = torch.ops.cortex_m
REPLACES = "cortex_m_replaces"  # a kernel node's meta: the quantize node whose value it computes
INT8 = (torch.int8, -128, 127)
# Activations a kernel's output bounds absorb: (low, high) in real numbers from the node's arguments.
ACTIVATIONS: dict = {aten.relu.default: lambda n: (0.0, None), aten.hardtanh.default: lambda n: (n.args[1], n.args[2]),
                     aten.clamp.default: lambda n: (n.args[1], n.args[2] if len(n.args) > 2 else None)}


def _int8_tensor(node) -> QParams | None:
    """Per-tensor int8 qparams of a quantize/dequantize node, else None."""
    if not (is_quantize(node) or is_dequantize(node)) or node.target not in (
            torch.ops.quantized_decomposed.quantize_per_tensor.default,
            torch.ops.quantized_decomposed.dequantize_per_tensor.default):
        return None
    q = qparams_of(node)
    return q if (q.dtype, q.qmin, q.qmax) == INT8 else None


def _output(node: Node) -> tuple[Node, QParams, int, int] | None:
    """The quantize that ends ``node``'s pattern (through one absorbed activation), its qparams and the int8
    bounds the activation leaves."""
    users = list(node.users)
    if len(users) != 1:
        return None
    bounds = (None, None)
    if users[0].target in ACTIVATIONS and len(users[0].users) == 1:
        bounds, users = ACTIVATIONS[users[0].target](users[0]), list(users[0].users)
    q = _int8_tensor(users[0])
    if q is None or not isinstance(bounds[0], (int, float, type(None))):
        return None
    low, high = q.qmin, q.qmax
    if bounds[0] is not None:
        low = max(low, int(q.quantize(torch.tensor(float(bounds[0])))))
    if bounds[1] is not None:
        high = min(high, int(q.quantize(torch.tensor(float(bounds[1])))))
    return users[0], q, low, high


def _input(node) -> tuple[Node, QParams] | None:
    """The int8 tensor a per-tensor dequantize reads, and its qparams."""
    q = _int8_tensor(node) if isinstance(node, Node) and is_dequantize(node) else None
    return (node.args[0], q) if q is not None else None


def _constant(gm: GraphModule, dq: Node) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(integer values, scales, zero points) of a dequantized constant (per-tensor or per-channel)."""
    if not (isinstance(dq, Node) and is_dequantize(dq) and dq.args[0].op == "get_attr"):
        return None
    q = qparams_of(dq, gm)
    return (graph_attr(gm, dq.args[0]), torch.as_tensor(q.scale, dtype=torch.float64).reshape(-1),
            torch.as_tensor(q.zero_point).reshape(-1))


def _attr(gm: GraphModule, name: str, value: torch.Tensor, before: Node) -> Node:
    """A new constant, read by a get_attr placed before ``before``."""
    gm.register_buffer(name, value.contiguous())
    with gm.graph.inserting_before(before):
        node = gm.graph.get_attr(name)
    node.meta["val"] = value
    return node


def _replace(gm: GraphModule, output: Node, target, args: tuple) -> Node:
    """``target(*args)`` in place of the pattern ending at quantize ``output``."""
    with gm.graph.inserting_before(output):
        node = gm.graph.call_function(target, args)
    node.meta = {**output.meta, REPLACES: output.meta.get(REPLACES, output.name)}
    output.replace_all_uses_with(node)
    return node


def _scratch(gm: GraphModule, size: int, before: Node) -> Node:
    with gm.graph.inserting_before(before):
        node = gm.graph.call_function(scratch_buffer, (size,))
    node.meta["val"] = torch.empty(size, dtype=torch.uint8)
    return node


def _requantize(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [multiplier_shift(float(s)) for s in scales]
    return (torch.tensor([m for m, _ in pairs], dtype=torch.int32),
            torch.tensor([s for _, s in pairs], dtype=torch.int32))


def convolution(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> convolution (int8 weights, zero point 0; int32 bias) -> q: quantized_conv2d (OHWI weights) or, for a
    one-image depthwise, quantized_depthwise_conv2d (IHWO)."""
    for node in list(gm.graph.nodes):
        if node.target != aten.convolution.default or node.args[6]:
            continue
        x, weight, bias = _input(node.args[0]), _constant(gm, node.args[1]), node.args[2]
        end = _output(node)
        bias_c = _constant(gm, bias) if bias is not None else None
        if x is None or weight is None or end is None or (bias is not None and bias_c is None) or \
                weight[0].dim() != 4 or bool((weight[2] != 0).any()):
            continue
        (src, qin), (w, w_scales, _), (out, qout, low, high) = x, weight, end
        stride, padding, dilation, groups = node.args[3], node.args[4], node.args[5], node.args[8]
        cin, cout, kh, kw = src.meta["val"].shape[1], w.shape[0], w.shape[2], w.shape[3]
        mult, shift = _requantize(qin.s * w_scales.expand(cout) / qout.s)
        prefix = f"_cortex_m_{node.name}"
        depthwise = groups == cin and cout % cin == 0 and out.meta["val"].shape[0] == 1
        values = bias_c[0].to(torch.int32) if bias_c is not None else (
            torch.zeros(cout, dtype=torch.int32) if groups > 1 else None)
        b = _attr(gm, prefix + "_bias", values, node) if values is not None else None
        m, s = _attr(gm, prefix + "_mult", mult, node), _attr(gm, prefix + "_shift", shift, node)
        in_shape = tuple(src.meta["val"].shape)
        if depthwise:
            w_node = _attr(gm, prefix + "_weight", w.permute(1, 2, 3, 0).to(torch.int8), node)
            size = depthwise_scratch(isa, in_shape, (kh, kw), cout // cin, tuple(dilation), tuple(padding))
            args = (src, w_node, b, stride, padding, dilation, cout // cin, -qin.zp, qout.zp, m, s, low, high,
                    _scratch(gm, size, node))
            _replace(gm, out, cm.quantized_depthwise_conv2d.default, args)
        else:
            w_node = _attr(gm, prefix + "_weight", w.permute(0, 2, 3, 1).to(torch.int8), node)
            size = conv_scratch(isa, (kh, kw, cin // groups), tuple(padding), tuple(stride))
            args = (src, w_node, b, stride, padding, dilation, -qin.zp, qout.zp, m, s, low, high,
                    _scratch(gm, size, node))
            _replace(gm, out, cm.quantized_conv2d.default, args)
    return _clean(gm)


def transposed_convolution(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> transposed convolution (one group, no output padding or dilation; int8 weights, zero point 0) -> q:
    quantized_transpose_conv2d (weights [Cin, Cout, KH, KW] stored OHWI)."""
    for node in list(gm.graph.nodes):
        if node.target != aten.convolution.default or not node.args[6]:
            continue
        x, weight, bias, end = _input(node.args[0]), _constant(gm, node.args[1]), node.args[2], _output(node)
        bias_c = _constant(gm, bias) if bias is not None else None
        stride, padding, dilation, output_padding, groups = node.args[3], node.args[4], node.args[5], node.args[7], \
            node.args[8]
        if x is None or weight is None or end is None or (bias is not None and bias_c is None) or groups != 1 or \
                list(output_padding) != [0, 0] or list(dilation) != [1, 1] or bool((weight[2] != 0).any()):
            continue
        (src, qin), (w, w_scales, _), (out, qout, low, high) = x, weight, end
        cin, cout, kh, kw = w.shape
        mult, shift = _requantize(qin.s * w_scales.expand(cout) / qout.s)
        prefix = f"_cortex_m_{node.name}"
        b = _attr(gm, prefix + "_bias", bias_c[0].to(torch.int32), node) if bias_c is not None else None
        sizes = transpose_conv_scratch(isa, cin, (kh, kw), cout, int(out.meta["val"].shape[3]), int(padding[1]))
        _replace(gm, out, cm.quantized_transpose_conv2d.default,
                 (src, _attr(gm, prefix + "_weight", w.permute(1, 2, 3, 0).to(torch.int8), node), b, stride, padding,
                  output_padding, dilation, -qin.zp, qout.zp, _attr(gm, prefix + "_mult", mult, node),
                  _attr(gm, prefix + "_shift", shift, node), low, high, *(_scratch(gm, n, node) for n in sizes)))
    return _clean(gm)


def linear(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> linear (per-tensor int8 weights, zero point 0) -> q: quantized_linear; on MVE the input offset and the
    bias fold into a kernel sum, elsewhere the int32 bias is passed."""
    for node in list(gm.graph.nodes):
        if node.target != aten.linear.default:
            continue
        x, weight = _input(node.args[0]), _constant(gm, node.args[1])
        bias = node.args[2] if len(node.args) > 2 else None
        bias_c = _constant(gm, bias) if bias is not None else None
        end = _output(node)
        if x is None or weight is None or end is None or weight[1].numel() != 1 or int(weight[2][0]) != 0 or \
                (bias is not None and bias_c is None):
            continue
        (src, qin), (w, w_scale, _), (out, qout, low, high) = x, weight, end
        mult, shift = multiplier_shift(qin.s * float(w_scale[0]) / qout.s)
        prefix = f"_cortex_m_{node.name}"
        w8 = w.to(torch.int8)
        values = bias_c[0].to(torch.int32) if bias_c is not None else torch.zeros(w.shape[0], dtype=torch.int32)
        w_node = _attr(gm, prefix + "_weight", w8, node)
        if isa == "MVE":
            kernel_sum = (-qin.zp * w8.to(torch.int32).sum(1) + values).reshape(1, -1).to(torch.int32)
            b, k = None, _attr(gm, prefix + "_kernel_sum", kernel_sum, node)
        else:
            b, k = (_attr(gm, prefix + "_bias", values, node) if bias_c is not None else None), None
        _replace(gm, out, cm.quantized_linear.default,
                 (src, w_node, b, k, -qin.zp, 0, qout.zp, [mult], [shift], high, low))
    return _clean(gm)


def add(gm: GraphModule, isa: str) -> GraphModule:
    """dq, dq -> add/sub (equal shapes, or a map and one value per channel) -> q: quantized_add, each operand rescaled to twice the larger scale after
    CMSIS-NN's 20-bit left shift."""
    for node in list(gm.graph.nodes):
        if node.target not in (aten.add.Tensor, aten.sub.Tensor) or len(node.args) != 2:
            continue
        a, b, end = _input(node.args[0]), _input(node.args[1]), _output(node)
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
        _replace(gm, out, cm.quantized_add.default, (sa, qa.zp, ma, sha, sb, qb.zp, -mb if coef < 0 else mb, shb,
                                                     qout.zp, mo, sho, low, high))
    return _clean(gm)


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
        a, b, end = _input(node.args[0]), _input(node.args[1]), _output(node)
        if a is None or b is None or end is None or not _elementwise_shapes(a[0], b[0]) or end[2:] != (-128, 127):
            continue
        (sa, qa), (sb, qb), (out, qout, _, _) = a, b, end
        _replace(gm, out, cm.quantized_mul.default, (sa, qa.zp, sb, qb.zp, qout.zp,
                                                     *multiplier_shift(qa.s * qb.s / qout.s)))
    return _clean(gm)


def _same_qparams(a: QParams, b: QParams) -> bool:
    return (a.s, a.zp) == (b.s, b.zp)


def mean(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> mean over H and W of a 4-D map -> q (the same qparams): a whole-plane average pool (a view drops the
    1x1 plane unless keepdim)."""
    for node in list(gm.graph.nodes):
        if node.target != aten.mean.dim or node.kwargs.get("dtype") is not None:
            continue
        x, end = _input(node.args[0]), _output(node)
        shape = x[0].meta["val"].shape if x is not None else ()
        if end is None or len(shape) != 4 or sorted(d % 4 for d in node.args[1]) != [2, 3] or \
                not _same_qparams(x[1], end[1]) or end[2:] != (-128, 127):
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
    return _clean(gm)


def avg_pool(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> avg_pool2d (no divisor override) -> q (the same qparams): quantized_avg_pool2d; a pool that counts its
    padding reads a cortex_m pad of the zero point first (ExecuTorch pads so even with zero padding)."""
    for node in list(gm.graph.nodes):
        if node.target != aten.avg_pool2d.default:
            continue
        args = list(node.args) + [None] * (7 - len(node.args))
        kernel, stride, padding, ceil_mode, include_pad, divisor = args[1:7]
        x, end = _input(args[0]), _output(node)
        if x is None or end is None or divisor is not None or not _same_qparams(x[1], end[1]) or \
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
    return _clean(gm)


def _avg_pool(gm: GraphModule, out: Node, src: Node, q: QParams, kernel, stride, padding, ceil_mode: bool,
              isa: str) -> Node:
    channels = int(src.meta["val"].shape[1])
    return _replace(gm, out, cm.quantized_avg_pool2d.default,
                    (src, kernel, stride, padding, ceil_mode, q.zp, *multiplier_shift(q.s),
                     _scratch(gm, 4 * channels if isa == "DSP" else 0, out)))


def max_pool(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> max_pool2d (its values; no dilation, no ceil mode) -> [relu/clamp] -> q (the same scale and zero
    point): quantized_max_pool2d."""
    for node in list(gm.graph.nodes):
        if node.target != aten.max_pool2d_with_indices.default or len(node.users) != 1:
            continue
        values = next(iter(node.users))
        args = list(node.args) + [None] * (6 - len(node.args))
        kernel, stride, padding, dilation, ceil_mode = args[1:6]
        x, end = _input(args[0]), _output(values) if values.args[1] == 0 else None
        if x is None or end is None or list(dilation or [1, 1]) != [1, 1] or ceil_mode or \
                not _same_qparams(x[1], end[1]):
            continue
        (src, q), (out, _, low, high) = x, end
        _replace(gm, out, cm.quantized_max_pool2d.default,
                 (src, list(kernel), list(stride or kernel), list(padding or [0, 0]), [1, 1], False, q.zp, q.zp,
                  low, high))
    return _clean(gm)


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
    sources = {(_input(d)[0], _input(d)[1].s, _input(d)[1].zp) if _input(d) else None for d in variable}
    inside = set(ops) | {out}
    if not ops or len(sources) != 1 or None in sources or any(set(n.users) - inside for n in ops) or \
            any(set(d.users) - inside for d in variable):
        return None
    source = _input(variable[0])
    every_int8 = source[1].dequantize(torch.arange(-128, 128, dtype=torch.int8), torch.float64)
    values = {d: every_int8 if constants[d] is None else constants[d] for d in leaves}
    order = {n: k for k, n in enumerate(out.graph.nodes)}
    return sorted(ops, key=order.get), values, source


def table(gm: GraphModule, isa: str) -> GraphModule:
    """An int8 -> int8 chain of element-wise ops (hardswish as torch decomposes it, sigmoid, GELU, ...):
    quantized_activation with its 256 outputs, computed as the fake-quantized model computes them (float64 between
    the dequantize and the quantize)."""
    for out in list(gm.graph.nodes):
        q = _int8_tensor(out) if is_quantize(out) else None
        found = _function_of_one_input(gm, out) if q is not None else None
        if found is None:
            continue
        ops, values, (src, _) = found
        for node in ops:
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: values[a])
            values[node] = node.target(*args, **kwargs).to(torch.float64)
        lut = q.quantize(values[out.args[0]])
        _replace(gm, out, cm.quantized_activation.default,
                 (src, _attr(gm, f"_cortex_m_{out.name}_lut", lut.to(torch.int8), out)))
    return _clean(gm)


def passthrough(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> a data-movement op (view, permute, ...) -> q with the same qparams: the op on the integers."""
    for node in list(gm.graph.nodes):
        src = node.args[0] if node.target in PASSTHROUGH and node.args else None
        if _input(src) is None or len(node.users) != 1:
            continue
        (x, qin), out = _input(src), next(iter(node.users))
        qout = _int8_tensor(out)
        if qout is None or (qout.s, qout.zp) != (qin.s, qin.zp):
            continue
        node.replace_input_with(src, x)
        node.meta.update(val=out.meta["val"], **{REPLACES: out.name})
        out.replace_all_uses_with(node)
    return _clean(gm)


def batch_matmul(gm: GraphModule, isa: str) -> GraphModule:
    """dq, dq -> bmm ([B, M, K] x [B, K, N]) -> q: quantized_batch_matmul of the left operand and the right one
    transposed (a constant stored so, else a cortex_m transpose)."""
    for node in list(gm.graph.nodes):
        if node.target != aten.bmm.default:
            continue
        a, end = _input(node.args[0]), _output(node)
        b = _input(node.args[1]) or None
        constant = _constant(gm, node.args[1])
        if a is None or end is None or end[2:] != (-128, 127) or (b is None and constant is None) or \
                (constant is not None and (constant[1].numel() != 1 or constant[0].dtype != torch.int8)):
            continue
        (src, qa), (out, qout, _, _) = a, end
        if constant is not None:
            values, scale, zero_point = constant
            rhs = _attr(gm, f"_cortex_m_{node.name}_rhs", values.transpose(1, 2).contiguous(), node)
            qb_s, qb_zp = float(scale[0]), int(zero_point[0])
        else:
            (right, qb), val = b, b[0].meta["val"]
            with gm.graph.inserting_before(out):
                rhs = gm.graph.call_function(cm.transpose.default, (right, [0, 2, 1]))
            rhs.meta["val"] = val.transpose(1, 2).contiguous()
            qb_s, qb_zp = qb.s, qb.zp
        n = int(node.meta["val"].shape[2])
        _replace(gm, out, cm.quantized_batch_matmul.default,
                 (src, -qa.zp, rhs, -qb_zp, qout.zp, *multiplier_shift(qa.s * qb_s / qout.s),
                  _scratch(gm, 4 * n if isa == "MVE" else 0, out)))
    return _clean(gm)


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
        if node.target in swap and _int8_tensor(node) is not None:
            node.target = swap[node.target]
    gm.recompile()
    return gm


def _clean(gm: GraphModule) -> GraphModule:
    """Drop what the replaced patterns left unread."""
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


PIPELINE: list[Callable] = [convolution, transposed_convolution, linear, add, mul, batch_matmul, mean, avg_pool, max_pool, table,
                             passthrough, transpose, boundaries]


def pipeline(isa: str) -> list[Callable[[GraphModule], GraphModule]]:
    """The passes for a core whose CMSIS-NN kernels are ``isa``'s (SCALAR, DSP or MVE)."""
    return [functools.partial(p, isa=isa) for p in PIPELINE]
