"""Layer ops, four ways: _fp (TOSA FP vs PyTorch), _int (TOSA INT vs the fake-quantized model), _u55 and
_u85 (quantized, compiled by Vela with every op on the NPU); where a target cannot run an op, the
partitioner refuses it with a reason."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import ethosu_delegates
from op_cases import OpTable, build_case, flavour_params, seed_inputs

pytestmark = pytest.mark.numerics


class MatMul(nn.Module):
    def forward(self, a, b):
        return a @ b


class MatMulTransposed(nn.Module):
    """Attention scores: q @ k^T over heads."""

    def forward(self, q, k):
        return torch.matmul(q, k.transpose(-1, -2))


class Bmm(nn.Module):
    def forward(self, a, b):
        return torch.bmm(a, b)


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class LogSoftmax(nn.Module):
    def __init__(self, dim=-1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.log_softmax(x, dim=self.dim)


def _randomized(module):
    """Non-trivial affine parameters and running statistics for a norm layer."""
    g = torch.Generator().manual_seed(1)
    for name, p in module.named_parameters():
        scale = torch.rand(p.shape, generator=g) + 0.5
        p.data = scale if "weight" in name else torch.randn(p.shape, generator=g) * 0.2
    if getattr(module, "running_mean", None) is not None:
        module.running_mean.uniform_(-0.5, 0.5, generator=g)
        module.running_var.uniform_(0.5, 2.0, generator=g)
    return module


class LinearBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)
        self.bn = _randomized(nn.BatchNorm1d(8))

    def forward(self, x):
        return self.bn(self.fc(x))


class Sdpa(nn.Module):
    def forward(self, q, k, v):
        return nn.functional.scaled_dot_product_attention(q, k, v)


class SelfAttention(nn.Module):
    """A transformer block's attention: projections, 2 heads, sdpa, merge heads, output projection."""

    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.out = (nn.Linear(dim, dim) for _ in range(4))

    def _split(self, x):
        b, t, d = x.shape
        return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x):
        b, t, d = x.shape
        y = nn.functional.scaled_dot_product_attention(self._split(self.q(x)), self._split(self.k(x)),
                                                       self._split(self.v(x)))
        return self.out(y.transpose(1, 2).reshape(b, t, d))


class Recurrent(nn.Module):
    """An nn.LSTM / nn.GRU returning its output sequence and final hidden state."""

    def __init__(self, cls, layers, batch_first, bidirectional=False):
        super().__init__()
        self.rnn = cls(16, 8, layers, batch_first=batch_first, bidirectional=bidirectional)

    def forward(self, x):
        out, state = self.rnn(x)
        return out, state[0] if isinstance(state, tuple) else state


# name -> (module factory, input shapes, which flavours apply)
ALL = ("fp", "int", "u55", "u85")
CASES = {
    "conv2d_grouped": (lambda: nn.Conv2d(8, 12, 3, 1, 1, groups=4), [(1, 8, 8, 8)], ALL),
    "conv2d_grouped_relu": (lambda: nn.Sequential(nn.Conv2d(8, 8, 3, 2, 1, groups=2, bias=False), nn.ReLU()),
                            [(1, 8, 9, 9)], ALL),
    "conv1d_grouped": (lambda: nn.Conv1d(8, 8, 3, 1, 1, groups=2), [(1, 8, 16)], ALL),
    "conv2d_dilated": (lambda: nn.Conv2d(4, 8, 3, 1, 2, dilation=2), [(1, 4, 12, 12)], ALL),
    "conv1d_dilated": (lambda: nn.Conv1d(4, 8, 3, 1, 3, dilation=3), [(1, 4, 20)], ALL),
    # past the NPU's dilation 2: output regions of the taps they read (ASPP's rates on a small map)
    "conv2d_dilated_5_regions": (lambda: nn.Conv2d(4, 8, 3, 1, 5, dilation=5), [(1, 4, 9, 9)], ALL),
    "conv2d_dilated_4x1": (lambda: nn.Conv2d(4, 8, 3, 1, (4, 1), dilation=(4, 1)), [(1, 4, 10, 6)], ALL),
    "conv2d_dilated_3_valid": (lambda: nn.Conv2d(4, 6, (3, 2), 1, 0, dilation=3), [(1, 4, 10, 8)], ALL),
    "conv2d_dilated_past_input": (lambda: nn.Conv2d(4, 8, 3, 1, 12, dilation=12), [(1, 4, 6, 7)], ALL),
    "conv2d_dilated_uneven_pad": (lambda: nn.Conv2d(4, 8, 5, 1, (7, 3), dilation=(4, 3)), [(1, 4, 9, 8)], ALL),
    "conv2d_dilated_bias_only_rows": (lambda: nn.Conv2d(4, 8, 3, 1, (12, 1), dilation=(5, 1)), [(1, 4, 6, 5)], ALL),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(8, 4, 3, 2, 1, 1), [(1, 8, 5, 5)], ALL),
    "conv_transpose2d_k4s2": (lambda: nn.ConvTranspose2d(4, 8, 4, 2, 1, bias=False), [(1, 4, 6, 6)], ALL),
    "conv_transpose2d_s1": (lambda: nn.ConvTranspose2d(4, 4, 3, 1, 0), [(1, 4, 6, 6)], ALL),
    # strides Ethos-U55's TRANSPOSE_CONV2D refuses (the U55 runs every stride as stride-1 CONV2Ds, one per row phase)
    "conv_transpose2d_s3": (lambda: nn.ConvTranspose2d(8, 4, 5, 3, 1, 2), [(1, 8, 5, 5)], ALL),
    "conv_transpose2d_s3x2": (lambda: nn.ConvTranspose2d(4, 8, (3, 4), (3, 2), (2, 1), (1, 0)), [(1, 4, 4, 6)], ALL),
    "conv_transpose2d_k2s3": (lambda: nn.ConvTranspose2d(4, 4, 2, 3, 0, 1), [(1, 4, 4, 5)], ALL),  # bias-only phases
    "matmul_2d": (MatMul, [(8, 16), (16, 4)], ALL),
    "matmul_3d_2d": (MatMul, [(2, 8, 16), (16, 4)], ALL),
    "bmm": (Bmm, [(2, 8, 16), (2, 16, 8)], ALL),
    "matmul_4d_transposed": (MatMulTransposed, [(1, 2, 8, 16), (1, 2, 8, 16)], ALL),
    "layer_norm": (lambda: _randomized(nn.LayerNorm(16)), [(2, 8, 16)], ALL),
    "layer_norm_2d_shape": (lambda: _randomized(nn.LayerNorm([4, 8])), [(2, 4, 8)], ALL),
    "layer_norm_no_affine": (lambda: nn.LayerNorm(16, elementwise_affine=False), [(1, 4, 16)], ALL),
    "group_norm": (lambda: _randomized(nn.GroupNorm(2, 8)), [(1, 8, 4, 4)], ALL),
    "batch_norm2d_input": (lambda: _randomized(nn.BatchNorm2d(4)), [(1, 4, 6, 6)], ALL),
    "batch_norm1d_after_linear": (LinearBatchNorm, [(2, 16)], ALL),
    "softmax": (Softmax, [(2, 16)], ALL),
    "softmax_4d": (Softmax, [(1, 2, 8, 8)], ALL),
    "log_softmax": (LogSoftmax, [(2, 16)], ALL),
    "log_softmax_dim1": (lambda: LogSoftmax(1), [(1, 10, 4)], ALL),
    "sdpa": (Sdpa, [(1, 2, 8, 16)] * 3, ALL),
    "self_attention": (SelfAttention, [(1, 8, 16)], ALL),
    "avg_pool2d_4x4": (lambda: nn.AvgPool2d(4, 4), [(1, 8, 8, 8)], ALL),
    "avg_pool2d_pad_counted": (lambda: nn.AvgPool2d(3, 1, 1), [(1, 4, 8, 8)], ALL),
    "avg_pool2d_12x12_valid": (lambda: nn.AvgPool2d(12, 1), [(1, 4, 14, 14)], ALL),
    "avg_pool2d_9x9_pad4": (lambda: nn.AvgPool2d(9, 1, 4), [(1, 4, 9, 9)], ALL),
    "avg_pool2d_pad_excluded": (lambda: nn.AvgPool2d(3, 2, 1, count_include_pad=False), [(1, 4, 9, 9)], ALL),
    "avg_pool2d_uneven": (lambda: nn.AvgPool2d(2, 2), [(1, 4, 9, 9)], ALL),
    "adaptive_avg_pool2d_2x2": (lambda: nn.AdaptiveAvgPool2d(2), [(1, 8, 8, 8)], ALL),
    "adaptive_avg_pool2d_3x2": (lambda: nn.AdaptiveAvgPool2d((3, 2)), [(1, 4, 9, 8)], ALL),
    "adaptive_max_pool2d_2x2": (lambda: nn.AdaptiveMaxPool2d(2), [(1, 8, 8, 8)], ALL),
    "upsample_nearest_2x": (lambda: nn.Upsample(scale_factor=2), [(1, 4, 5, 5)], ALL),
    "upsample_nearest_4x2": (lambda: nn.Upsample(scale_factor=(4, 2)), [(1, 4, 3, 4)], ALL),
    "upsample_nearest_3x": (lambda: nn.Upsample(scale_factor=3), [(1, 4, 4, 4)], ALL),
    "upsample_nearest_3x1": (lambda: nn.Upsample(scale_factor=(3, 1)), [(1, 4, 4, 5)], ALL),
    "upsample_bilinear_2x": (lambda: nn.Upsample(scale_factor=2, mode="bilinear"), [(1, 4, 5, 5)], ALL),
    "upsample_bilinear_4x": (lambda: nn.Upsample(scale_factor=4, mode="bilinear"), [(1, 4, 3, 3)], ALL),
    "upsample_bilinear_3x2": (lambda: nn.Upsample(scale_factor=(3, 2), mode="bilinear"), [(1, 3, 4, 5)], ALL),
    "upsample_bilinear_1x5": (lambda: nn.Upsample(scale_factor=(1, 5), mode="bilinear"), [(1, 2, 3, 4)], ALL),
    "upsample_bilinear_16x": (lambda: nn.Upsample(scale_factor=16, mode="bilinear"), [(1, 3, 3, 2)], ALL),
    "lstm_2layer_batch_first": (lambda: Recurrent(nn.LSTM, 2, True), [(1, 8, 16)], ALL),
    "lstm_1layer_seq_first": (lambda: Recurrent(nn.LSTM, 1, False), [(4, 1, 16)], ALL),
    "gru_2layer_batch_first": (lambda: Recurrent(nn.GRU, 2, True), [(1, 4, 16)], ALL),
    "gru_1layer_seq_first": (lambda: Recurrent(nn.GRU, 1, False), [(4, 1, 16)], ALL),
    "gru_bidirectional": (lambda: Recurrent(nn.GRU, 1, True, True), [(1, 3, 16)], ALL),
    "lstm_bidirectional": (lambda: Recurrent(nn.LSTM, 1, False, True), [(3, 1, 16)], ALL),
}


def _params(flavour):
    return flavour_params(CASES, flavour)


def _case(name):
    return build_case(CASES, name)


OP_TABLE = OpTable({name: case[-1] for name, case in CASES.items()}, _case)


@pytest.mark.parametrize("name", _params("fp"))
def test_layers_op_fp(harness, name):
    module, inputs = _case(name)
    harness.fp(module, inputs)


@pytest.mark.parametrize("name", _params("int"))
def test_layers_op_int(harness, name):
    module, inputs = _case(name)
    harness.int(module, inputs)


@pytest.mark.parametrize("name", _params("u55"))
def test_layers_op_u55(harness, name):
    module, inputs = _case(name)
    harness.ethosu(module, inputs, "ethos-u55-128", case=name)


@pytest.mark.parametrize("name", _params("u85"))
def test_layers_op_u85(harness, name):
    module, inputs = _case(name)
    harness.ethosu(module, inputs, "ethos-u85-256")


def test_adaptive_avg_pool_uneven_windows_refused_with_reason(harness):
    """7x7 to 3x3 needs windows of different sizes: the op stays on the CPU and the reason says so."""
    compiled = harness.compile(nn.AdaptiveAvgPool2d(3).eval(), seed_inputs((1, 4, 7, 7)), "TOSA-1.0+FP",
                               quantize=False)
    [left] = harness.cpu_compute(compiled)
    assert "adaptive" in left.target and "windows of different sizes" in left.reason


def test_upsample_refused_on_u55_with_reason(harness):
    """A bilinear upsampling past what the phase form keeps exact stays on the CPU with the limit named."""
    module = nn.Sequential(nn.Conv2d(4, 4, 1), nn.Upsample(scale_factor=64, mode="bilinear"))
    compiled = harness.compile(module.eval(), seed_inputs((1, 4, 2, 2)), "ethos-u55-128", quantize=True)
    [left] = harness.cpu_compute(compiled)
    assert "upsample" in left.target and "up to 63x per axis (this one is 64x64)" in left.reason
    assert compiled.edge.delegates  # the convolution still runs on the NPU


class TokenEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)

    def forward(self, tokens):
        return self.emb(tokens)


TOKENS = (torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]], dtype=torch.int32),)


@pytest.mark.parametrize("flavour", ["fp", "int", "u85"])
def test_embedding(harness, flavour):
    """GATHER of the embedding table at int32 token ids."""
    torch.manual_seed(0)
    module = TokenEmbedding().eval()
    compiled = {"fp": harness.fp, "int": harness.int}.get(flavour, lambda m, i: harness.ethosu(m, i, "ethos-u85-256"))(
        module, TOKENS)
    assert any("GATHER" in d.tosa_ops for d in compiled.edge.delegates)


def test_embedding_refused_on_u55_with_reason(harness):
    torch.manual_seed(0)
    compiled = harness.compile(TokenEmbedding().eval(), TOKENS, "ethos-u55-128", quantize=True)
    [left] = harness.cpu_compute(compiled)[-1:]
    assert left.target == "aten.embedding.default" and "Ethos-U55/U65" in left.reason


def test_embedding_int64_ids_stay_on_cpu_with_reason(harness):
    """TOSA has no int64: int64 ids keep the embedding on the CPU, and the reason says what to pass."""
    compiled = harness.compile(TokenEmbedding().eval(), (TOKENS[0].long(),), "TOSA-1.0+FP", quantize=False)
    [left] = harness.cpu_compute(compiled)
    assert left.target == "aten.embedding.default" and "int32" in left.reason


def test_grouped_conv_is_one_conv2d_per_group(harness):
    compiled = harness.fp(nn.Conv2d(8, 12, 3, 1, 1, groups=4).eval(), seed_inputs((1, 8, 8, 8)))
    [delegate] = compiled.edge.delegates
    assert delegate.tosa_ops["CONV2D"] == 4 and delegate.tosa_ops["CONCAT"] == 1


def _conv_dilations(tosa: bytes) -> set[int]:
    """The dilations of every CONV2D in a TOSA graph."""
    from tosa.Conv2dAttribute import Conv2dAttribute
    from tosa.TosaGraph import TosaGraph

    from tosakit.lower.tosa_graph import Op

    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    found = set()
    for op in (block.Operators(i) for i in range(block.OperatorsLength())):
        if op.Op() == Op.CONV2D:
            attr = Conv2dAttribute()
            attr.Init(op.Attribute().Bytes, op.Attribute().Pos)
            found.update(int(d) for d in attr.DilationAsNumpy())
    return found


def _live_tap_macs(size_hw, kernel, dilation, pad, cin, cout) -> int:
    """MACs of a stride-1 convolution counting only taps that read the input (none of the padding)."""
    live = []
    for size, k, d, p in zip(size_hw, kernel, dilation, pad):
        live.append([sum(0 <= i + t * d - p < size for t in range(k)) for i in range(size + 2 * p - (k - 1) * d)])
    return sum(r * c for r in live[0] for c in live[1]) * cin * cout


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
@pytest.mark.parametrize("rate", [6, 12, 24])
def test_aspp_dilation_multiplies_no_padding_u55_u85(harness, target, rate):
    """DeepLabV3's ASPP 3x3 branches (rates 6, 12, 24 on a 14x14 map) past the NPU's dilation 2: no CONV2D
    keeps a dilation (Vela would run a zero-stuffed (2r+1)x(2r+1) kernel), and Vela's MAC count is exactly the
    products of taps that read the input (rate 24: the centre tap alone). Every op on the NPU, integers as the
    fake-quantized model's."""
    module = nn.Conv2d(8, 16, 3, 1, rate, dilation=rate).eval()
    compiled = harness.ethosu(module, seed_inputs((1, 8, 14, 14)), target)
    [delegate] = compiled.edge.delegates
    conv_macs = sum(o.macs for o in delegate.report.per_op if o.tosa_op == "CONV2D")  # (Vela counts copies too)
    assert conv_macs == _live_tap_macs((14, 14), (3, 3), (rate, rate), (rate, rate), 8, 16)
    [(tosa, _)] = ethosu_delegates(compiled)
    assert _conv_dilations(tosa) == {1}


@pytest.mark.parametrize("module, why", [
    (nn.ConvTranspose2d(4, 4, 3, 2, groups=2), "groups=2"),
    (nn.ConvTranspose2d(4, 4, 3, 1, dilation=2), "dilation"),
], ids=["groups", "dilation"])
def test_conv_transpose2d_limits_refused_with_reason(harness, module, why):
    compiled = harness.compile(module.eval(), seed_inputs((1, 4, 5, 5)), "TOSA-1.0+FP", quantize=False)
    [left] = harness.cpu_compute(compiled)
    assert left.target == "aten.convolution.default" and why in left.reason


PHASED = ["conv_transpose2d", "conv_transpose2d_k4s2", "conv_transpose2d_s1", "conv_transpose2d_s3",
          "conv_transpose2d_s3x2", "conv_transpose2d_k2s3"]


def test_conv_transpose2d_stride3_delegated_on_u55(harness):
    """Stride 3 on ethos-u55-128 runs whole on the NPU as one stride-1 CONV2D per row phase; Ethos-U85 keeps
    its TRANSPOSE_CONV2D."""
    module, inputs = _case("conv_transpose2d_s3")
    u55 = harness.compile(module, inputs, "ethos-u55-128", quantize=True)
    harness.assert_delegated(u55)
    [delegate] = u55.edge.delegates
    assert delegate.tosa_ops["CONV2D"] == 3 and "TRANSPOSE_CONV2D" not in delegate.tosa_ops
    assert delegate.report.cpu_ops == 0
    [u85] = harness.compile(module, inputs, "ethos-u85-256", quantize=True).edge.delegates
    assert u85.tosa_ops["TRANSPOSE_CONV2D"] == 1 and "CONV2D" not in u85.tosa_ops


@pytest.mark.parametrize("config", ["a8w8", "a16w8"])
@pytest.mark.parametrize("name", PHASED)
def test_conv_transpose2d_phases_equal_transpose_conv2d(harness, name, config):
    """The sub-pixel form (TOSA-1.0+INT+u55) gives the integers TRANSPOSE_CONV2D (TOSA-1.0+INT) gives: the
    same accumulator sums, the same RESCALE."""
    from tosakit.quantize import get_symmetric_a16w8_quantization_config
    from tosakit.runtime import run_edge

    module, inputs = _case(name)
    kw = {"config": get_symmetric_a16w8_quantization_config()} if config == "a16w8" else {}
    plain, phased = (harness.compile(module, inputs, target, quantize=True, **kw)
                     for target in ("TOSA-1.0+INT", "TOSA-1.0+INT+u55"))
    assert "TRANSPOSE_CONV2D" in plain.edge.delegates[0].tosa_ops
    assert "TRANSPOSE_CONV2D" not in phased.edge.delegates[0].tosa_ops
    for a, b in zip(run_edge(plain.edge, *inputs), run_edge(phased.edge, *inputs)):
        assert torch.equal(a, b)
