"""The Cortex-M passes for the kernels with weights: convolution, depthwise and transposed convolution (CMSIS-NN's
convolution functions), linear and batch matmul (its fully connected and matrix functions)."""

from __future__ import annotations

import torch
from torch.fx import GraphModule

from .ops import multiplier_shift
from .patterns import (aten, clean, cm, dequantized_constant, new_constant, pattern_input, pattern_output,
                       per_channel_requantize, replace_pattern, scratch)
from .scratch import conv_scratch, depthwise_scratch, transpose_conv_scratch


def convolution(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> convolution (int8 weights, zero point 0; int32 bias) -> q: quantized_conv2d (OHWI weights) or, for a
    one-image depthwise, quantized_depthwise_conv2d (IHWO)."""
    for node in list(gm.graph.nodes):
        if node.target != aten.convolution.default or node.args[6]:
            continue
        x, weight, bias = pattern_input(node.args[0]), dequantized_constant(gm, node.args[1]), node.args[2]
        end = pattern_output(node)
        bias_c = dequantized_constant(gm, bias) if bias is not None else None
        if x is None or weight is None or end is None or (bias is not None and bias_c is None) or \
                weight[0].dim() != 4 or bool((weight[2] != 0).any()):
            continue
        (src, qin), (w, w_scales, _), (out, qout, low, high) = x, weight, end
        stride, padding, dilation, groups = node.args[3], node.args[4], node.args[5], node.args[8]
        cin, cout, kh, kw = src.meta["val"].shape[1], w.shape[0], w.shape[2], w.shape[3]
        mult, shift = per_channel_requantize(qin.s * w_scales.expand(cout) / qout.s)
        prefix = f"_cortex_m_{node.name}"
        depthwise = groups == cin and cout % cin == 0 and out.meta["val"].shape[0] == 1
        values = bias_c[0].to(torch.int32) if bias_c is not None else (
            torch.zeros(cout, dtype=torch.int32) if groups > 1 else None)
        b = new_constant(gm, prefix + "_bias", values, node) if values is not None else None
        m, s = new_constant(gm, prefix + "_mult", mult, node), new_constant(gm, prefix + "_shift", shift, node)
        in_shape = tuple(src.meta["val"].shape)
        if depthwise:
            w_node = new_constant(gm, prefix + "_weight", w.permute(1, 2, 3, 0).to(torch.int8), node)
            size = depthwise_scratch(isa, in_shape, (kh, kw), cout // cin, tuple(dilation), tuple(padding))
            args = (src, w_node, b, stride, padding, dilation, cout // cin, -qin.zp, qout.zp, m, s, low, high,
                    scratch(gm, size, node))
            replace_pattern(gm, out, cm.quantized_depthwise_conv2d.default, args)
        else:
            w_node = new_constant(gm, prefix + "_weight", w.permute(0, 2, 3, 1).to(torch.int8), node)
            size = conv_scratch(isa, (kh, kw, cin // groups), tuple(padding), tuple(stride))
            args = (src, w_node, b, stride, padding, dilation, -qin.zp, qout.zp, m, s, low, high,
                    scratch(gm, size, node))
            replace_pattern(gm, out, cm.quantized_conv2d.default, args)
    return clean(gm)


def transposed_convolution(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> transposed convolution (one group, no output padding or dilation; int8 weights, zero point 0) -> q:
    quantized_transpose_conv2d (weights [Cin, Cout, KH, KW] stored OHWI)."""
    for node in list(gm.graph.nodes):
        if node.target != aten.convolution.default or not node.args[6]:
            continue
        x, weight, bias = pattern_input(node.args[0]), dequantized_constant(gm, node.args[1]), node.args[2]
        end = pattern_output(node)
        bias_c = dequantized_constant(gm, bias) if bias is not None else None
        stride, padding, dilation, output_padding, groups = node.args[3], node.args[4], node.args[5], node.args[7], \
            node.args[8]
        if x is None or weight is None or end is None or (bias is not None and bias_c is None) or groups != 1 or \
                list(output_padding) != [0, 0] or list(dilation) != [1, 1] or bool((weight[2] != 0).any()):
            continue
        (src, qin), (w, w_scales, _), (out, qout, low, high) = x, weight, end
        cin, cout, kh, kw = w.shape
        mult, shift = per_channel_requantize(qin.s * w_scales.expand(cout) / qout.s)
        prefix = f"_cortex_m_{node.name}"
        b = new_constant(gm, prefix + "_bias", bias_c[0].to(torch.int32), node) if bias_c is not None else None
        sizes = transpose_conv_scratch(isa, cin, (kh, kw), cout, int(out.meta["val"].shape[3]), int(padding[1]))
        w_node = new_constant(gm, prefix + "_weight", w.permute(1, 2, 3, 0).to(torch.int8), node)
        m, s = new_constant(gm, prefix + "_mult", mult, node), new_constant(gm, prefix + "_shift", shift, node)
        args = (src, w_node, b, stride, padding, output_padding, dilation, -qin.zp, qout.zp, m, s, low, high,
                *(scratch(gm, n, node) for n in sizes))
        replace_pattern(gm, out, cm.quantized_transpose_conv2d.default, args)
    return clean(gm)


def linear(gm: GraphModule, isa: str) -> GraphModule:
    """dq -> linear (per-tensor int8 weights, zero point 0) -> q: quantized_linear; on MVE the input offset and the
    bias fold into a kernel sum, elsewhere the int32 bias is passed."""
    for node in list(gm.graph.nodes):
        if node.target != aten.linear.default:
            continue
        x, weight = pattern_input(node.args[0]), dequantized_constant(gm, node.args[1])
        bias = node.args[2] if len(node.args) > 2 else None
        bias_c = dequantized_constant(gm, bias) if bias is not None else None
        end = pattern_output(node)
        if x is None or weight is None or end is None or weight[1].numel() != 1 or int(weight[2][0]) != 0 or \
                (bias is not None and bias_c is None):
            continue
        (src, qin), (w, w_scale, _), (out, qout, low, high) = x, weight, end
        mult, shift = multiplier_shift(qin.s * float(w_scale[0]) / qout.s)
        prefix = f"_cortex_m_{node.name}"
        w8 = w.to(torch.int8)
        values = bias_c[0].to(torch.int32) if bias_c is not None else torch.zeros(w.shape[0], dtype=torch.int32)
        w_node = new_constant(gm, prefix + "_weight", w8, node)
        if isa == "MVE":
            kernel_sum = (-qin.zp * w8.to(torch.int32).sum(1) + values).reshape(1, -1).to(torch.int32)
            b, k = None, new_constant(gm, prefix + "_kernel_sum", kernel_sum, node)
        else:
            b, k = (new_constant(gm, prefix + "_bias", values, node) if bias_c is not None else None), None
        replace_pattern(gm, out, cm.quantized_linear.default,
                        (src, w_node, b, k, -qin.zp, 0, qout.zp, [mult], [shift], high, low))
    return clean(gm)


def batch_matmul(gm: GraphModule, isa: str) -> GraphModule:
    """dq, dq -> bmm ([B, M, K] x [B, K, N]) -> q: quantized_batch_matmul of the left operand and the right one
    transposed (a constant stored so, else a cortex_m transpose)."""
    for node in list(gm.graph.nodes):
        if node.target != aten.bmm.default:
            continue
        a, end = pattern_input(node.args[0]), pattern_output(node)
        b = pattern_input(node.args[1]) or None
        constant = dequantized_constant(gm, node.args[1])
        if a is None or end is None or end[2:] != (-128, 127) or (b is None and constant is None) or \
                (constant is not None and (constant[1].numel() != 1 or constant[0].dtype != torch.int8)):
            continue
        (src, qa), (out, qout, _, _) = a, end
        if constant is not None:
            values, scale, zero_point = constant
            rhs = new_constant(gm, f"_cortex_m_{node.name}_rhs", values.transpose(1, 2).contiguous(), node)
            qb_s, qb_zp = float(scale[0]), int(zero_point[0])
        else:
            (right, qb), val = b, b[0].meta["val"]
            with gm.graph.inserting_before(out):
                rhs = gm.graph.call_function(cm.transpose.default, (right, [0, 2, 1]))
            rhs.meta["val"] = val.transpose(1, 2).contiguous()
            qb_s, qb_zp = qb.s, qb.zp
        n = int(node.meta["val"].shape[2])
        args = (src, -qa.zp, rhs, -qb_zp, qout.zp, *multiplier_shift(qa.s * qb_s / qout.s),
                scratch(gm, 4 * n if isa == "MVE" else 0, out))
        replace_pattern(gm, out, cm.quantized_batch_matmul.default, args)
    return clean(gm)
