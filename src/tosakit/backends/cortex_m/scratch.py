"""The scratch bytes a CMSIS-NN kernel needs, per instruction-set class (SCALAR, DSP, MVE), as ExecuTorch 1.5.1
sizes them through CMSIS-NN's ``*_get_buffer_size`` functions (measured through its binding, int8 activations and
weights); a kernel call passes a planned buffer of that size (``scratch_buffer``)."""

from __future__ import annotations

import torch


def scratch_buffer(size: int) -> torch.Tensor:
    """Graph marker for a kernel's scratch: a planned buffer of ``size`` bytes, written by no instruction (ExecuTorch's
    memory.alloc). Here, not in ``ops``, so that emitting a program does not register the cortex_m operators."""
    return torch.empty(size, dtype=torch.uint8)


def _align(value: int, to: int) -> int:
    return -(-value // to) * to


def conv_scratch(isa: str, kernel: tuple[int, int, int], padding: tuple[int, int], stride: tuple[int, int]) -> int:
    """A convolution's im2col buffer for a (KH, KW, input channels per group) kernel; a 1x1 unpadded one with
    stride 1 or 2 reads its input directly."""
    kh, kw, cin = kernel
    if (kh, kw) == (1, 1) and tuple(padding) == (0, 0) and max(stride) <= 2:
        return 0
    return 4 * _align(kh * kw * cin, 16 if isa == "MVE" else 4)


def depthwise_scratch(isa: str, input_shape: tuple[int, ...], kernel: tuple[int, int], multiplier: int,
                      dilation: tuple[int, int], padding: tuple[int, int]) -> int:
    """A depthwise convolution's buffer for an NCHW ``input_shape``, a (KH, KW) kernel and a depth multiplier."""
    batch, channels = input_shape[0], input_shape[1]
    kh, kw = kernel
    if multiplier > 1:
        return 4 * _align(kh * kw, 16) + channels * multiplier * kh * kw if isa == "MVE" and channels == 1 else 0
    if tuple(dilation) != (1, 1) or batch != 1:
        return 0
    if isa == "MVE":
        return 4 * 124 * kh * kw
    if isa == "DSP" and not ((kh, kw) == (3, 3) and max(padding) <= 1):
        return 2 * channels * kh * kw
    return 0


def transpose_conv_scratch(isa: str, input_channels: int, kernel: tuple[int, int], out_channels: int,
                           out_width: int, pad_width: int) -> tuple[int, int]:
    """A transposed convolution's (scratch, output scratch): up to 16 input channels CMSIS-NN accumulates rows of
    the output; past that it runs a reversed convolution with an im2col buffer and a weight copy."""
    kh, kw = kernel
    if input_channels <= 16:
        return 4 * (out_width + 2 * pad_width) * kh * out_channels, 0
    return 4 * _align(input_channels * kh * kw, 16 if isa == "MVE" else 4), out_channels * kh * kw * input_channels
