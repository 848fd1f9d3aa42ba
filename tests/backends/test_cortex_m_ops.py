"""tosakit's cortex_m:: operators against ExecuTorch 1.5.1's reference implementations of them (its
backends/cortex_m/ops, in the oracle env), bit for bit, on seeded arguments as its Cortex-M passes make them
(multipliers and shifts from real scales, offsets, activation bounds) and on edge ones (full-range inputs, tight
activation bounds, strides, dilation, groups, depth multipliers)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tosakit.backends.cortex_m.ops import SCHEMAS, multiplier_shift

pytestmark = pytest.mark.oracle

CASES = 12


def _int8(rng, shape):
    return torch.from_numpy(rng.integers(-128, 128, shape, dtype=np.int8))


def _scale(rng):
    return float(np.exp(rng.uniform(np.log(1e-4), np.log(0.5))))


def _bounds(rng):
    low = int(rng.choice([-128, -128, int(rng.integers(-128, 0))]))
    return low, int(rng.choice([127, 127, int(rng.integers(low + 1, 128))]))


def _operands(rng):
    """Two int8 operands: equal shapes, or (a third of the time) a channels-last map and one value per channel."""
    shape = tuple(int(d) for d in rng.integers(1, 6, 4))
    if rng.integers(3):
        return _int8(rng, shape), _int8(rng, shape)
    last = torch.channels_last
    a = _int8(rng, shape).contiguous(memory_format=last)
    b = _int8(rng, (1, shape[1], 1, 1)).contiguous(memory_format=last)
    return (a, b) if rng.integers(2) else (b, a)


def _add_args(rng):
    (a, b), (s1, s2, so) = _operands(rng), (_scale(rng), _scale(rng), _scale(rng))
    double = 2 * max(s1, s2)
    low, high = _bounds(rng)
    return [a, int(rng.integers(-128, 128)), *multiplier_shift(s1 / double), b,
            int(rng.integers(-128, 128)), *multiplier_shift(s2 / double), int(rng.integers(-128, 128)),
            *multiplier_shift(double / (so * (1 << 20))), low, high]


def _mul_args(rng):
    a, b = _operands(rng)
    return [a, int(rng.integers(-128, 128)), b, int(rng.integers(-128, 128)),
            int(rng.integers(-128, 128)), *multiplier_shift(_scale(rng) * _scale(rng) / _scale(rng))]


def _div_args(rng):
    """Equal shapes (division takes no broadcast), int8 or int16, a divisor at its zero point now and then."""
    shape = tuple(int(d) for d in rng.integers(1, 6, 4))
    if rng.integers(2):
        a, b = _int8(rng, shape), _int8(rng, shape)
        zps = [int(z) for z in rng.integers(-128, 128, 3)]
    else:
        a, b = (torch.from_numpy(rng.integers(-32768, 32768, shape, dtype=np.int16)) for _ in range(2))
        zps = [0, 0, 0]
    b.view(-1)[:: max(b.numel() // 3, 1)] = zps[1]
    return [a, zps[0], b, zps[1], zps[2], _scale(rng) / (_scale(rng) * _scale(rng))]


def _linear_args(rng):
    k, n = int(rng.integers(1, 40)), int(rng.integers(1, 12))
    x, w = _int8(rng, (int(rng.integers(1, 4)), int(rng.integers(1, 4)), k)), _int8(rng, (n, k))
    bias = torch.from_numpy(rng.integers(-5000, 5000, n, dtype=np.int32))
    zp = int(rng.integers(-128, 128))
    mult, shift = multiplier_shift(_scale(rng) * _scale(rng) / _scale(rng))
    low, high = _bounds(rng)
    if rng.integers(2):  # the MVE form: kernel_sum folds the input offset and the bias
        kernel_sum = (-zp * w.to(torch.int32).sum(1) + bias).reshape(1, n)
        return [x, w, None, kernel_sum, -zp, 0, int(rng.integers(-128, 128)), [mult], [shift], high, low]
    return [x, w, bias, None, -zp, 0, int(rng.integers(-128, 128)), [mult], [shift], high, low]


def _conv_common(rng, out_channels):
    scales = [_scale(rng) for _ in range(out_channels)]
    pairs = [multiplier_shift(s * 0.02 / 0.05) for s in scales]
    low, high = _bounds(rng)
    return (torch.tensor([m for m, _ in pairs], dtype=torch.int32),
            torch.tensor([s for _, s in pairs], dtype=torch.int32),
            low, high)


def _spatial(rng, kernel, dilation):
    """An input height and width the dilated kernel fits in, up to 5 more."""
    return [int(rng.integers(k * d, k * d + 6)) for k, d in zip(kernel, dilation)]


def _conv_args(rng, dilated=False):
    groups = int(rng.choice([1, 1, 2]))
    cin, cout = groups * int(rng.integers(1, 5)), groups * int(rng.integers(1, 5))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    stride = [int(s) for s in rng.integers(1, 3, 2)]
    dilation = [int(d) for d in rng.integers(2, 4, 2)] if dilated else [1, 1]  # ExecuTorch's reference: 1 only
    padding = [int(rng.integers(0, kh)), int(rng.integers(0, kw))]
    x = _int8(rng, (1, cin, *_spatial(rng, (kh, kw), dilation)))
    w = _int8(rng, (cout, kh, kw, cin // groups))
    bias = torch.from_numpy(rng.integers(-20000, 20000, cout, dtype=np.int32)) if rng.integers(3) else None
    mult, shift, low, high = _conv_common(rng, cout)
    return [x.contiguous(memory_format=torch.channels_last), w, bias, stride, padding, dilation,
            -int(rng.integers(-128, 128)), int(rng.integers(-128, 128)), mult, shift, low, high,
            torch.zeros(16, dtype=torch.uint8)]


def _depthwise_args(rng, dilated=False):
    cin, multiplier = int(rng.integers(1, 6)), int(rng.choice([1, 1, 2]))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    stride = [int(s) for s in rng.integers(1, 3, 2)]
    dilation = [int(d) for d in rng.integers(2, 4, 2)] if dilated else [1, 1]
    x = _int8(rng, (1, cin, *_spatial(rng, (kh, kw), dilation)))
    w = _int8(rng, (1, kh, kw, cin * multiplier))
    bias = torch.from_numpy(rng.integers(-20000, 20000, cin * multiplier, dtype=np.int32))
    mult, shift, low, high = _conv_common(rng, cin * multiplier)
    return [x.contiguous(memory_format=torch.channels_last), w, bias, stride,
            [int(rng.integers(0, kh)), int(rng.integers(0, kw))], dilation, multiplier,
            -int(rng.integers(-128, 128)), int(rng.integers(-128, 128)), mult, shift, low, high,
            torch.zeros(16, dtype=torch.uint8)]


def _quantize_args(rng):
    x = torch.from_numpy(rng.normal(0, 3, (2, 7)).astype(np.float32))
    x[0, :3] = torch.tensor([0.5, -0.5, 1e9])  # ties, saturation
    return [x, _scale(rng), int(rng.integers(-128, 128)), -128, 127, torch.int8]


def _dequantize_args(rng):
    return [_int8(rng, (3, 5)), _scale(rng), int(rng.integers(-128, 128)), -128, 127, torch.int8]


def _pool_window(rng):
    k = [int(d) for d in rng.integers(1, 4, 2)]
    padding = [int(rng.integers(0, k[0] // 2 + 1)), int(rng.integers(0, k[1] // 2 + 1))]
    return k, [int(d) for d in rng.integers(1, 3, 2)], padding


def _avg_pool_args(rng):
    k, stride, padding = _pool_window(rng)
    x = _int8(rng, (1, int(rng.integers(1, 6)), int(rng.integers(k[0], 9)), int(rng.integers(k[1], 9))))
    zp = int(rng.integers(-128, 128))
    return [x.contiguous(memory_format=torch.channels_last), k, stride, padding, bool(rng.integers(2)), zp,
            *multiplier_shift(_scale(rng)), torch.zeros(8, dtype=torch.uint8)]


def _max_pool_args(rng):
    k, stride, padding = _pool_window(rng)
    x = _int8(rng, (int(rng.integers(1, 3)), int(rng.integers(1, 6)), int(rng.integers(k[0], 9)),
                    int(rng.integers(k[1], 9))))
    zp = int(rng.integers(-128, 128))
    low, high = _bounds(rng)
    return [x.contiguous(memory_format=torch.channels_last), k, stride, padding, [1, 1], False, zp, zp, low, high]


def _pad_args(rng):
    rank = int(rng.integers(1, 5))
    x = _int8(rng, tuple(int(d) for d in rng.integers(1, 5, rank)))
    if rank == 4 and rng.integers(2):
        x = x.contiguous(memory_format=torch.channels_last)
    return [x, [int(d) for d in rng.integers(0, 3, 4)], [int(d) for d in rng.integers(0, 3, 4)],
            int(rng.integers(-128, 128))]


def _activation_args(rng):
    return [_int8(rng, tuple(int(d) for d in rng.integers(1, 6, 3))), _int8(rng, (256,))]


def _transpose_args(rng):
    rank = int(rng.integers(1, 5))
    return [_int8(rng, tuple(int(d) for d in rng.integers(1, 5, rank))), [int(d) for d in rng.permutation(rank)]]


def _batch_matmul_args(rng):
    # K <= 16 keeps ExecuTorch's float32 accumulation exact (|acc| < 2**24); tosakit's is exact at any K.
    b, m, n, k = (int(d) for d in rng.integers(1, 7, 4)) if rng.integers(2) else (1, 8, 8, 16)
    return [_int8(rng, (b, m, k)), -int(rng.integers(-128, 128)), _int8(rng, (b, n, k)), -int(rng.integers(-128, 128)),
            int(rng.integers(-128, 128)), *multiplier_shift(_scale(rng) * _scale(rng) / _scale(rng)),
            torch.zeros(4 * n, dtype=torch.uint8)]


def _transpose_conv_args(rng):
    cin, cout = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    kh, kw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    stride = [int(s) for s in rng.integers(1, 4, 2)]
    padding = [int(rng.integers(0, kh)), int(rng.integers(0, kw))]
    x = _int8(rng, (1, cin, int(rng.integers(1, 6)), int(rng.integers(1, 6))))
    bias = torch.from_numpy(rng.integers(-20000, 20000, cout, dtype=np.int32)) if rng.integers(3) else None
    mult, shift, low, high = _conv_common(rng, cout)
    return [x.contiguous(memory_format=torch.channels_last), _int8(rng, (cout, kh, kw, cin)), bias, stride, padding,
            [0, 0], [1, 1], -int(rng.integers(-128, 128)), int(rng.integers(-128, 128)), mult, shift, low, high,
            torch.zeros(16, dtype=torch.uint8), torch.zeros(0, dtype=torch.uint8)]


def _softmax_args(rng):
    x = _int8(rng, tuple(int(d) for d in rng.integers(1, 7, int(rng.integers(2, 4)))))
    real = min(_scale(rng) * (1 << 26), float((1 << 31) - 1))
    mult, shift = multiplier_shift(real)
    return [x, int(rng.choice([-1, x.dim() - 1])), int(rng.integers(-128, 128)), -128, mult, shift,
            -int(31 * 2.0 ** 26 / 2.0 ** shift)]


def _extremum_args(rng):
    return list(_operands(rng))


ARGUMENTS = {"quantized_add": _add_args, "quantized_mul": _mul_args, "quantized_div": _div_args, "quantized_linear": _linear_args,
             "quantized_conv2d": _conv_args, "quantized_depthwise_conv2d": _depthwise_args,
             "quantize_per_tensor": _quantize_args, "dequantize_per_tensor": _dequantize_args,
             "quantized_avg_pool2d": _avg_pool_args, "quantized_max_pool2d": _max_pool_args, "pad": _pad_args,
             "quantized_activation": _activation_args, "transpose": _transpose_args,
             "quantized_batch_matmul": _batch_matmul_args, "quantized_transpose_conv2d": _transpose_conv_args,
             "softmax": _softmax_args, "minimum": _extremum_args, "maximum": _extremum_args}


def test_every_operator_has_cases():
    assert set(ARGUMENTS) == set(SCHEMAS)


def test_kernel_list_has_executorch_schemas(et_oracle):
    """program/kernels_cortex_m.txt (what emission and the runtime trust) and the operators tosakit registers give
    each kernel the schema ExecuTorch 1.5.1 registers it with."""
    from tosakit.program.kernels import kernel_schemas

    theirs = et_oracle.cortex_m_schemas(sorted(SCHEMAS))
    ours = {k.split("::")[1].split(".")[0] for k in kernel_schemas() if k.startswith("cortex_m::")}
    assert ours == set(SCHEMAS)
    for name, schema in theirs.items():
        assert schema == str(getattr(torch.ops.cortex_m, name).out._schema), name
        line = next(ln for ln in (Path(__file__).resolve().parents[2] / "src/tosakit/program/kernels_cortex_m.txt")
                    .read_text().splitlines() if ln.startswith(f"cortex_m::{name}.out("))
        assert line == schema, (line, schema)


@pytest.mark.parametrize("op", sorted(ARGUMENTS))
def test_cortex_m_operator_equals_executorch_reference_int(op, et_oracle, tmp_path):
    """Each case bit-exact with ExecuTorch's reference implementation, in shape, dtype and every value."""
    rng = np.random.default_rng(sum(map(ord, op)))
    cases = [ARGUMENTS[op](rng) for _ in range(CASES)]
    theirs = et_oracle.cortex_m_op(op, cases, tmp_path)
    for k, (args, want) in enumerate(zip(cases, theirs)):
        got = getattr(torch.ops.cortex_m, op)(*args)
        assert got.dtype == want.dtype and got.shape == want.shape, (k, got.dtype, want.dtype, got.shape, want.shape)
        assert torch.equal(got, want), (k, int((got.double() - want.double()).abs().max()))
    assert any(bool((w != 0).any()) for w in theirs)


def _float64_conv(x, weight_oihw, bias, stride, padding, dilation, groups, input_offset, output_offset, mult, shift,
                  low, high):
    """The kernels' arithmetic with float64 accumulation (exact at these sizes) and the requantize spelled out."""
    acc = torch.nn.functional.conv2d(x.double() + input_offset, weight_oihw.double(),
                                     None if bias is None else bias.double(), stride, padding, dilation, groups)
    acc = acc.round().to(torch.int64)
    out = torch.empty_like(acc)
    for c in range(acc.shape[1]):
        m, s = int(mult[c]), int(shift[c])
        high_mul = ((acc[:, c] << max(s, 0)) * m + (1 << 30)) >> 31
        right = max(-s, 0)
        if right:
            mask = (1 << right) - 1
            rem, high_mul = high_mul & mask, high_mul >> right
            high_mul = high_mul + (rem > (mask >> 1) + (high_mul < 0).to(torch.int64)).to(torch.int64)
        out[:, c] = high_mul
    return (out + output_offset).clamp(low, high).to(torch.int8)


@pytest.mark.parametrize("op", ["quantized_conv2d", "quantized_depthwise_conv2d"])
def test_dilated_convolution_equals_the_float64_convolution_int(op):
    """Dilation (ExecuTorch's reference cannot run it: torch has no integer dilated convolution) against the same
    arithmetic accumulated in float64."""
    rng = np.random.default_rng(7)
    for _ in range(CASES):
        args = ARGUMENTS[op](rng, dilated=True)
        got = getattr(torch.ops.cortex_m, op)(*args)
        x, w, bias, stride, padding, dilation = args[:6]
        if op == "quantized_conv2d":
            weight, groups, rest = w.permute(0, 3, 1, 2), x.shape[1] // w.shape[3], args[6:12]
        else:
            weight, groups, rest = w.permute(3, 0, 1, 2), x.shape[1], args[7:13]
        want = _float64_conv(x, weight, bias, stride, padding, dilation, groups, *rest)
        assert torch.equal(got, want)
