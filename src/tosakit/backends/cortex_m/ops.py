"""ExecuTorch 1.5.1's Cortex-M operators (namespace ``cortex_m``; CMSIS-NN kernels on the device): their schemas as
its ``operators.yaml`` declares them, and the integer semantics its reference implementations define, which the host
runtime runs. Requantization is CMSIS-NN's: a doubling high multiply rounding half up, then a divide by a power of two
rounding ties away from zero (``requantize``); a scale is a 31-bit multiplier and a power-of-two shift
(``multiplier_shift``). Offsets follow CMSIS-NN: convolution and linear take minus the input zero point, the
element-wise kernels the zero points themselves.

Importing this module registers the operators with torch (functional and ``.out`` forms). In a process where
ExecuTorch already registered them (tosakit never imports it; a user's script may) its definitions are kept."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401  (registers the ops)

SHIFT_INT8 = 20  # CMSIS-NN's left shift of element-wise operands before their rescale

# Each operator's arguments, as ExecuTorch 1.5.1's operators.yaml declares them.
SCHEMAS: dict[str, str] = {
    "quantize_per_tensor": "Tensor input, float scale, int zero_point, int quant_min, int quant_max, "
                           "ScalarType dtype",
    "dequantize_per_tensor": "Tensor input, float scale, int zero_point, int quant_min, int quant_max, "
                             "ScalarType dtype",
    "quantized_add": "Tensor self, int self_zero_point, int self_multiplier, int self_shift, Tensor other, "
                     "int other_zero_point, int other_multiplier, int other_shift, int output_zero_point, "
                     "int output_multiplier, int output_shift, int activation_min, int activation_max",
    "quantized_mul": "Tensor self, int self_zero_point, Tensor other, int other_zero_point, int output_zero_point, "
                     "int output_multiplier, int output_shift",
    "quantized_div": "Tensor self, int self_zero_point, Tensor other, int other_zero_point, int output_zero_point, "
                     "float output_scale",
    "quantized_linear": "Tensor input, Tensor weights, Tensor? bias, Tensor? kernel_sum, int input_offset, "
                        "int filter_offset, int output_offset, int[] requantize_multipliers, "
                        "int[] requantize_shifts, int activation_max, int activation_min",
    "quantized_conv2d": "Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
                        "int input_offset, int output_offset, Tensor requantize_multipliers, "
                        "Tensor requantize_shifts, int activation_min, int activation_max, Tensor scratch",
    "quantized_transpose_conv2d": "Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, "
                                  "int[] output_padding, int[] dilation, int input_offset, int output_offset, "
                                  "Tensor requantize_multipliers, Tensor requantize_shifts, int activation_min, "
                                  "int activation_max, Tensor scratch, Tensor output_scratch",
    "quantized_avg_pool2d": "Tensor input, int[] kernel_size, int[] stride, int[] padding, bool ceil_mode, "
                            "int zero_point, int multiplier, int shift, Tensor scratch",
    "quantized_max_pool2d": "Tensor input, int[] kernel_size, int[] stride, int[] padding, int[] dilation, "
                            "bool ceil_mode, int input_zero_point, int output_zero_point, int activation_min, "
                            "int activation_max",
    "pad": "Tensor input, int[] pre_pad, int[] post_pad, int pad_value",
    "quantized_activation": "Tensor input, Tensor lut",
    "softmax": "Tensor input, int dim, int input_zero_point, int output_zero_point, int input_multiplier, "
               "int input_shift, int diff_min",
    "transpose": "Tensor input, int[] perm",
    "minimum": "Tensor self, Tensor other",
    "maximum": "Tensor self, Tensor other",
    "quantized_batch_matmul": "Tensor lhs, int lhs_zero_point, Tensor rhs_transposed, int rhs_zero_point, "
                              "int output_zero_point, int output_multiplier, int output_shift, Tensor scratch",
    "quantized_depthwise_conv2d": "Tensor input, Tensor weight, Tensor? bias, int[] stride, int[] padding, "
                                  "int[] dilation, int depth_multiplier, int input_offset, int output_offset, "
                                  "Tensor requantize_multipliers, Tensor requantize_shifts, int activation_min, "
                                  "int activation_max, Tensor scratch",
}


def multiplier_shift(scale: float) -> tuple[int, int]:
    """A positive real scale as (multiplier, shift): scale = multiplier * 2**shift / 2**31, multiplier in
    [2**30, 2**31) (frexp's mantissa rounded to 31 bits; one that rounds up to 2**31 is halved)."""
    if scale == 0.0:
        return 0, 0
    mantissa, shift = math.frexp(scale)
    fixed = round(mantissa * (1 << 31))
    if fixed == 1 << 31:
        fixed, shift = fixed // 2, shift + 1
    return max(-(1 << 31), min((1 << 31) - 1, fixed)), shift


def requantize(x: torch.Tensor, multiplier, shift) -> torch.Tensor:
    """CMSIS-NN's requantize of int32 ``x`` (per element; ``multiplier``/``shift`` broadcast), in int64, the result
    wrapped to int32."""
    x = x.to(torch.int64)
    multiplier = torch.as_tensor(multiplier, dtype=torch.int64)
    shift = torch.as_tensor(shift, dtype=torch.int64)
    value = x << shift.clamp(min=0)
    high = (value * multiplier + (1 << 30)) >> 31
    right = (-shift).clamp(min=0)
    mask = (torch.ones_like(right) << right) - 1
    remainder = high & mask
    high = high >> right
    threshold = (mask >> 1) + (high < 0).to(torch.int64)
    return (high + (remainder > threshold).to(torch.int64)).to(torch.int32)


def _saturate(x: torch.Tensor, low: int, high: int) -> torch.Tensor:
    """int32 ``x`` clamped to [low, high], as int8."""
    return x.clamp(low, high).to(torch.int8)


def quantize_per_tensor(x, scale, zero_point, quant_min, quant_max, dtype):
    return torch.ops.quantized_decomposed.quantize_per_tensor(x, scale, zero_point, quant_min, quant_max, dtype)


def dequantize_per_tensor(q, scale, zero_point, quant_min, quant_max, dtype):
    return torch.ops.quantized_decomposed.dequantize_per_tensor(q, scale, zero_point, quant_min, quant_max, dtype)


def quantized_add(a, a_zp, a_mult, a_shift, b, b_zp, b_mult, b_shift, out_zp, out_mult, out_shift, act_min,
                  act_max):
    left = requantize((a.to(torch.int32) - a_zp) << SHIFT_INT8, a_mult, a_shift)
    right = requantize((b.to(torch.int32) - b_zp) << SHIFT_INT8, b_mult, b_shift)
    total = requantize(left + right, out_mult, out_shift)  # int32 sum, as the kernel adds
    return _saturate(total + out_zp, act_min, act_max)


def quantized_mul(a, a_zp, b, b_zp, out_zp, out_mult, out_shift):
    product = (a.to(torch.int32) - a_zp) * (b.to(torch.int32) - b_zp)
    return _saturate(requantize(product, out_mult, out_shift) + out_zp, -128, 127)


def quantized_div(a, a_zp, b, b_zp, out_zp, out_scale):
    """No CMSIS-NN kernel divides: float32 quotients of the offset operands (0 where the divisor is), scaled,
    rounded half to even, saturated to the operands' type (int8 or int16)."""
    num, den = (a.to(torch.int32) - a_zp).to(torch.float32), (b.to(torch.int32) - b_zp).to(torch.float32)
    quotient = torch.where(den != 0, num / den, torch.zeros_like(num))
    info = torch.iinfo(a.dtype)
    return (torch.round(quotient * out_scale) + out_zp).clamp(info.min, info.max).to(a.dtype)


def quantized_linear(x, weights, bias, kernel_sum, input_offset, filter_offset, output_offset, multipliers, shifts,
                     act_max, act_min):
    rows = x.reshape(-1, x.shape[-1]).to(torch.int32)
    w = weights.to(torch.int32)
    if kernel_sum is not None:  # the MVE form: the input offset is folded into kernel_sum, the bias too
        acc = rows @ w.T + rows.sum(-1, keepdim=True) * filter_offset + kernel_sum
    else:
        acc = (rows + input_offset) @ (w + filter_offset).T
        acc = acc + bias if bias is not None else acc
    acc = acc.reshape(*x.shape[:-1], w.shape[0])
    return _saturate(requantize(acc, int(multipliers[0]), int(shifts[0])) + output_offset,
                     act_min, act_max)


def _conv(x, weight_oihw, bias, stride, padding, dilation, groups, input_offset, output_offset, multipliers, shifts,
          act_min, act_max):
    """An int32 convolution of the offset input (padding adds zeros after the offset: real zeros), requantized
    per output channel."""
    weight = weight_oihw.to(torch.int32)
    if tuple(dilation) != (1, 1):  # torch has no integer dilated convolution: the kernel's taps spread out instead
        kh, kw = weight.shape[2:]
        spread = weight.new_zeros((*weight.shape[:2], (kh - 1) * dilation[0] + 1, (kw - 1) * dilation[1] + 1))
        spread[:, :, ::dilation[0], ::dilation[1]] = weight
        weight = spread
    acc = F.conv2d(x.to(torch.int32) + int(input_offset), weight, None if bias is None else bias.to(torch.int32),
                   tuple(stride), tuple(padding), 1, groups)
    per_channel = (-1, 1, 1)
    out = requantize(acc, multipliers.reshape(per_channel), shifts.reshape(per_channel))
    return _saturate(out + output_offset, act_min, act_max).contiguous(memory_format=torch.channels_last)


def quantized_conv2d(x, weight, bias, stride, padding, dilation, input_offset, output_offset, multipliers, shifts,
                     act_min, act_max, scratch):
    """``weight`` OHWI; grouped when the input has more channels than a filter."""
    return _conv(x, weight.permute(0, 3, 1, 2), bias, stride, padding, dilation, x.shape[1] // weight.shape[3],
                 input_offset, output_offset, multipliers, shifts, act_min, act_max)


def quantized_depthwise_conv2d(x, weight, bias, stride, padding, dilation, depth_multiplier, input_offset,
                               output_offset, multipliers, shifts, act_min, act_max, scratch):
    """``weight`` IHWO: [1, KH, KW, C * depth_multiplier]."""
    return _conv(x, weight.permute(3, 0, 1, 2), bias, stride, padding, dilation, x.shape[1], input_offset,
                 output_offset, multipliers, shifts, act_min, act_max)


def quantized_transpose_conv2d(x, weight, bias, stride, padding, output_padding, dilation, input_offset,
                               output_offset, multipliers, shifts, act_min, act_max, scratch, output_scratch):
    """``weight`` OHWI; accumulated exactly (float64 holds every sum of int8 products and an int32 bias; ExecuTorch's
    reference accumulates in float32, exact below 2**24)."""
    acc = F.conv_transpose2d(x.to(torch.float64) + int(input_offset), weight.permute(3, 0, 1, 2).to(torch.float64),
                             None if bias is None else bias.to(torch.float64), tuple(stride), tuple(padding),
                             tuple(output_padding), x.shape[1] // weight.shape[3], tuple(dilation))
    per_channel = (-1, 1, 1)
    out = requantize(acc.round().to(torch.int32), multipliers.reshape(per_channel), shifts.reshape(per_channel))
    return _saturate(out + output_offset, act_min, act_max).contiguous(memory_format=torch.channels_last)


def _transpose_conv_shape(x, w, b, stride, padding, output_padding, dilation, *rest):
    size = [(x.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (w.shape[1 + i] - 1) + output_padding[i]
            + 1 for i in range(2)]
    return torch.empty((x.shape[0], w.shape[0], *size), dtype=torch.int8, device=x.device).contiguous(
        memory_format=torch.channels_last)


def _real_scale(multiplier: int, shift: int) -> float:
    return multiplier * (2 ** shift) / (1 << 31)


def quantized_avg_pool2d(x, kernel_size, stride, padding, ceil_mode, zero_point, multiplier, shift, scratch):
    """The window mean of the dequantized values (pad excluded), quantized again: ExecuTorch's reference does it in
    float32, and so does this (the same torch operations, so the same ties)."""
    scale = _real_scale(multiplier, shift)
    mean = F.avg_pool2d((x.float() - zero_point) * scale, tuple(kernel_size), tuple(stride), tuple(padding),
                        ceil_mode, count_include_pad=False)
    return (torch.round(mean / scale) + zero_point).clamp(-128, 127).to(torch.int8)


def quantized_max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, input_zp, output_zp, act_min,
                         act_max):
    """The window maximum of the integers (padding never wins), clamped to the activation bounds."""
    pooled = F.max_pool2d(x.to(memory_format=torch.contiguous_format), tuple(kernel_size), tuple(stride),
                          tuple(padding), tuple(dilation), ceil_mode)
    return pooled.clamp(act_min, act_max).to(torch.int8).contiguous(memory_format=torch.channels_last)


NHWC_TO_LOGICAL = (0, 3, 1, 2)  # a channels-last tensor's physical (N, H, W, C) padding read in (N, C, H, W)


def channels_last(x: torch.Tensor) -> bool:
    """How the kernels see a 4-D tensor: channels-last when its dim order says so, or when C or H*W is 1."""
    return x.dim() == 4 and (x.shape[1] == 1 or x.shape[2] == x.shape[3] == 1 or list(x.dim_order()[:2]) == [0, 2])


def pad(x, pre_pad, post_pad, pad_value):
    """Constant padding given per physical dimension (four entries, the last ``rank`` used)."""
    if channels_last(x):
        pre_pad, post_pad = [pre_pad[i] for i in NHWC_TO_LOGICAL], [post_pad[i] for i in NHWC_TO_LOGICAL]
    offset, widths = 4 - x.dim(), []
    for i in reversed(range(x.dim())):
        widths += [pre_pad[offset + i], post_pad[offset + i]]
    return F.pad(x, widths, mode="constant", value=pad_value)


def quantized_activation(x, lut):
    """A 256-entry int8 table indexed by the input + 128: any int8 -> int8 element-wise function."""
    return lut[x.to(torch.int32) + 128].to(torch.int8)


SOFTMAX_INPUT_BITS = 5  # integer bits of CMSIS-NN's softmax input (its multiplier scales by 2**26)


def softmax(x, dim, input_zp, output_zp, input_multiplier, input_shift, diff_min):
    """Probabilities in steps of 1/256 from -128: ExecuTorch's reference computes them in float32 from the input scale
    the multiplier encodes, and so does this (the same torch operations, so the same ties)."""
    scale = _real_scale(input_multiplier, input_shift) / (1 << (31 - SOFTMAX_INPUT_BITS))
    probabilities = torch.softmax((x.to(torch.int32) - int(input_zp)).float() * scale, dim=dim)
    return (torch.round(probabilities / (1 / 256)) + int(output_zp)).clamp(-128, 127).to(torch.int8)


def transpose(x, perm):
    """The permuted tensor, laid out contiguously."""
    return x.permute(tuple(perm)).contiguous()


def quantized_batch_matmul(lhs, lhs_offset, rhs_transposed, rhs_offset, out_zp, out_mult, out_shift, scratch):
    """[B, M, K] x [B, N, K] (the right operand transposed), offsets added, accumulated exactly in int64 (CMSIS-NN's
    int32 accumulator; ExecuTorch's reference accumulates in float32, exact below 2**24)."""
    acc = torch.bmm(lhs.to(torch.int64) + lhs_offset, (rhs_transposed.to(torch.int64) + rhs_offset).transpose(1, 2))
    return _saturate(requantize(acc.to(torch.int32), out_mult, out_shift) + out_zp, -128, 127)


def _pool_shape(x, kernel, stride, padding, ceil_mode, dilation=(1, 1)):
    size = []
    for i in range(2):
        span = x.shape[2 + i] + 2 * padding[i] - dilation[i] * (kernel[i] - 1) - 1
        out = (span + (stride[i] - 1 if ceil_mode else 0)) // stride[i] + 1
        if ceil_mode and (out - 1) * stride[i] >= x.shape[2 + i] + padding[i]:
            out -= 1
        size.append(out)
    return torch.empty((x.shape[0], x.shape[1], *size), dtype=torch.int8, device=x.device).contiguous(
        memory_format=torch.channels_last)


def _pad_shape(x, pre_pad, post_pad, value):
    if channels_last(x):
        pre_pad, post_pad = [pre_pad[i] for i in NHWC_TO_LOGICAL], [post_pad[i] for i in NHWC_TO_LOGICAL]
    offset = 4 - x.dim()
    return x.new_empty([d + pre_pad[offset + i] + post_pad[offset + i] for i, d in enumerate(x.shape)])


def _conv_shape(x, weight_hw, stride, padding, dilation, channels):
    size = [(x.shape[2 + i] + 2 * padding[i] - dilation[i] * (weight_hw[i] - 1) - 1) // stride[i] + 1
            for i in range(2)]
    return torch.empty((x.shape[0], channels, *size), dtype=torch.int8, device=x.device).contiguous(
        memory_format=torch.channels_last)


@dataclass(frozen=True)
class Operator:
    """One cortex_m operator: what it computes, and its output for fake tensors."""

    compute: Callable
    fake: Callable


OPERATORS: dict[str, Operator] = {
    "quantize_per_tensor": Operator(quantize_per_tensor, lambda x, *a: torch.empty_like(x, dtype=a[-1])),
    "dequantize_per_tensor": Operator(dequantize_per_tensor, lambda q, *a: torch.empty_like(q, dtype=torch.float)),
    "quantized_add": Operator(quantized_add, lambda a, *r: torch.empty_like(a if a.numel() >= r[3].numel() else r[3])),
    "quantized_mul": Operator(quantized_mul, lambda a, az, b, *r: torch.empty_like(a if a.numel() >= b.numel() else b)),
    "quantized_div": Operator(quantized_div, lambda a, *r: torch.empty_like(a)),
    "quantized_linear": Operator(quantized_linear, lambda x, w, *r: x.new_empty((*x.shape[:-1], w.shape[0]))),
    "quantized_conv2d": Operator(quantized_conv2d, lambda x, w, b, s, p, d, *r: _conv_shape(x, w.shape[1:3], s, p, d,
                                                                                            w.shape[0])),
    "quantized_transpose_conv2d": Operator(quantized_transpose_conv2d, _transpose_conv_shape),
    "quantized_avg_pool2d": Operator(quantized_avg_pool2d, lambda x, k, s, p, c, *r: _pool_shape(x, k, s, p, c)),
    "quantized_max_pool2d": Operator(quantized_max_pool2d,
                                     lambda x, k, s, p, d, c, *r: _pool_shape(x, k, s, p, c, d)),
    "pad": Operator(pad, _pad_shape),
    "quantized_activation": Operator(quantized_activation, lambda x, lut: torch.empty_like(x)),
    "softmax": Operator(softmax, lambda x, *a: torch.empty_like(x)),
    "minimum": Operator(torch.minimum, lambda a, b: a.new_empty(torch.broadcast_shapes(a.shape, b.shape))),
    "maximum": Operator(torch.maximum, lambda a, b: a.new_empty(torch.broadcast_shapes(a.shape, b.shape))),
    "transpose": Operator(transpose, lambda x, perm: x.permute(tuple(perm)).contiguous()),
    "quantized_batch_matmul": Operator(quantized_batch_matmul,
                                       lambda a, az, b, *r: a.new_empty((a.shape[0], a.shape[1], b.shape[1]))),
    "quantized_depthwise_conv2d": Operator(quantized_depthwise_conv2d,
                                           lambda x, w, b, s, p, d, *r: _conv_shape(x, w.shape[1:3], s, p, d,
                                                                                    w.shape[3])),
}


def schema(name: str, out: bool = False) -> str:
    """The operator's schema as ExecuTorch defines it (``out``: its ``.out`` form, the one programs call)."""
    args = SCHEMAS[name]
    if out:
        return f"{name}.out({args}, *, Tensor(a!) out) -> Tensor(a!)"
    return f"{name}({args}) -> Tensor"


def _register() -> None:
    if hasattr(torch.ops.cortex_m, "quantized_add"):  # ExecuTorch's own library is loaded: its definitions stand
        return
    lib = torch.library.Library("cortex_m", "DEF")  # noqa: TOR901  (kept alive below)
    for name, op in OPERATORS.items():
        lib.define(schema(name))
        lib.define(schema(name, out=True))
        lib.impl(name, op.compute, "CompositeExplicitAutograd")
        lib.impl(f"{name}.out", _out_form(op.compute), "CompositeExplicitAutograd")
        torch.library.register_fake(f"cortex_m::{name}", op.fake, lib=lib)
    _LIBRARIES.append(lib)


def _out_form(compute: Callable) -> Callable:
    def out_form(*args, out):
        return out.copy_(compute(*args))
    return out_form


_LIBRARIES: list = []
_register()
