"""Layer ops: grouped, dilated and transposed convolutions, matrix products, norms, softmax, attention, pooling,
upsampling, recurrent layers."""

from __future__ import annotations

import torch
from torch import nn

from support.op_cases import OpCase, OpTable


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


class ConvMlp(nn.Module):
    """PVT v2's MLP: tokens to a feature map, a depthwise convolution, back to tokens, GELU, a projection."""

    def __init__(self, c=16, hidden=32, side=6):
        super().__init__()
        self.side = side
        self.fc1, self.dw, self.fc2 = nn.Linear(c, hidden), nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden), \
            nn.Linear(hidden, c)

    def forward(self, x):
        x = self.fc1(x).transpose(1, 2).reshape(x.shape[0], -1, self.side, self.side)
        return self.fc2(nn.functional.gelu(self.dw(x).flatten(2).transpose(1, 2)))


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


class ChannelsLastGroupNorm(nn.Module):
    """Group norm of a tensor laid out channels-last in memory (timm's CPUBone): its groups are not a view."""

    def __init__(self):
        super().__init__()
        self.norm = _randomized(nn.GroupNorm(2, 8))

    def forward(self, x):
        return self.norm(x.contiguous(memory_format=torch.channels_last))


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


class FusedQkvAttention(nn.Module):
    """One head whose q, k and v are channel slices of one projection (timm's attention): q, a slice, is the left
    operand of a MATMUL (Vela 5.2 miscompiles that on Ethos-U55 unless tosakit copies it first)."""

    def __init__(self, dim=24):
        super().__init__()
        self.dim = dim
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        q, k, v = self.qkv(x).unsqueeze(1).split(self.dim, dim=-1)
        return ((q @ k.transpose(-2, -1)) * self.dim ** -0.5).softmax(-1) @ v


class CausalSoftmax(nn.Module):
    """Scores masked with -inf above the diagonal, then softmax (a decoder's causal attention weights)."""

    def forward(self, scores):
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        return scores.masked_fill(~mask, float("-inf")).softmax(-1)


class Recurrent(nn.Module):
    """An nn.LSTM / nn.GRU returning its output sequence and final hidden state."""

    def __init__(self, cls, layers, batch_first, bidirectional=False):
        super().__init__()
        self.rnn = cls(16, 8, layers, batch_first=batch_first, bidirectional=bidirectional)

    def forward(self, x):
        out, state = self.rnn(x)
        return out, state[0] if isinstance(state, tuple) else state


CASES = {
    "conv2d_grouped": OpCase(lambda: nn.Conv2d(8, 12, 3, 1, 1, groups=4), [(1, 8, 8, 8)]),
    "conv2d_grouped_relu": OpCase(lambda: nn.Sequential(nn.Conv2d(8, 8, 3, 2, 1, groups=2, bias=False), nn.ReLU()),
                                  [(1, 8, 9, 9)]),
    "conv1d_grouped": OpCase(lambda: nn.Conv1d(8, 8, 3, 1, 1, groups=2), [(1, 8, 16)]),
    "conv2d_dilated": OpCase(lambda: nn.Conv2d(4, 8, 3, 1, 2, dilation=2), [(1, 4, 12, 12)]),
    "conv1d_dilated": OpCase(lambda: nn.Conv1d(4, 8, 3, 1, 3, dilation=3), [(1, 4, 20)]),
    # past the NPU's dilation 2: output regions of the taps they read (ASPP's rates on a small map)
    "conv2d_dilated_5_regions": OpCase(lambda: nn.Conv2d(4, 8, 3, 1, 5, dilation=5), [(1, 4, 9, 9)]),
    "conv2d_dilated_4x1": OpCase(lambda: nn.Conv2d(4, 8, 3, 1, (4, 1), dilation=(4, 1)), [(1, 4, 10, 6)]),
    "conv2d_dilated_3_valid": OpCase(lambda: nn.Conv2d(4, 6, (3, 2), 1, 0, dilation=3), [(1, 4, 10, 8)]),
    "conv2d_dilated_past_input": OpCase(lambda: nn.Conv2d(4, 8, 3, 1, 12, dilation=12), [(1, 4, 6, 7)]),
    "conv2d_dilated_uneven_pad": OpCase(lambda: nn.Conv2d(4, 8, 5, 1, (7, 3), dilation=(4, 3)), [(1, 4, 9, 8)]),
    "conv2d_dilated_bias_only_rows": OpCase(lambda: nn.Conv2d(4, 8, 3, 1, (12, 1), dilation=(5, 1)), [(1, 4, 6, 5)]),
    "conv_transpose2d": OpCase(lambda: nn.ConvTranspose2d(8, 4, 3, 2, 1, 1), [(1, 8, 5, 5)]),
    "conv_transpose2d_k4s2": OpCase(lambda: nn.ConvTranspose2d(4, 8, 4, 2, 1, bias=False), [(1, 4, 6, 6)]),
    "conv_transpose2d_s1": OpCase(lambda: nn.ConvTranspose2d(4, 4, 3, 1, 0), [(1, 4, 6, 6)]),
    # strides Ethos-U55's TRANSPOSE_CONV2D refuses (the U55 runs every stride as stride-1 CONV2Ds, one per row phase)
    "conv_transpose2d_s3": OpCase(lambda: nn.ConvTranspose2d(8, 4, 5, 3, 1, 2), [(1, 8, 5, 5)]),
    "conv_transpose2d_s3x2": OpCase(lambda: nn.ConvTranspose2d(4, 8, (3, 4), (3, 2), (2, 1), (1, 0)), [(1, 4, 4, 6)]),
    "conv_transpose2d_k2s3": OpCase(lambda: nn.ConvTranspose2d(4, 4, 2, 3, 0, 1), [(1, 4, 4, 5)]),  # bias-only phases
    "matmul_2d": OpCase(MatMul, [(8, 16), (16, 4)]),
    "matmul_3d_2d": OpCase(MatMul, [(2, 8, 16), (16, 4)]),
    "bmm": OpCase(Bmm, [(2, 8, 16), (2, 16, 8)]),
    "matmul_4d_transposed": OpCase(MatMulTransposed, [(1, 2, 8, 16), (1, 2, 8, 16)]),
    "layer_norm": OpCase(lambda: _randomized(nn.LayerNorm(16)), [(2, 8, 16)]),
    "layer_norm_2d_shape": OpCase(lambda: _randomized(nn.LayerNorm([4, 8])), [(2, 4, 8)]),
    "layer_norm_no_affine": OpCase(lambda: nn.LayerNorm(16, elementwise_affine=False), [(1, 4, 16)]),
    "group_norm": OpCase(lambda: _randomized(nn.GroupNorm(2, 8)), [(1, 8, 4, 4)]),
    "group_norm_channels_last": OpCase(ChannelsLastGroupNorm, [(1, 8, 4, 4)]),
    "group_norm_one_group": OpCase(lambda: _randomized(nn.GroupNorm(1, 8)), [(1, 8, 4, 4)]),
    "group_norm_group_per_channel": OpCase(lambda: _randomized(nn.GroupNorm(8, 8)), [(1, 8, 4, 4)]),
    "batch_norm2d_input": OpCase(lambda: _randomized(nn.BatchNorm2d(4)), [(1, 4, 6, 6)]),
    "batch_norm1d_after_linear": OpCase(LinearBatchNorm, [(2, 16)]),
    "conv_mlp_gelu_tokens": OpCase(ConvMlp, [(1, 36, 16)]),
    "softmax": OpCase(Softmax, [(2, 16)]),
    "softmax_4d": OpCase(Softmax, [(1, 2, 8, 8)]),
    "log_softmax": OpCase(LogSoftmax, [(2, 16)]),
    "log_softmax_dim1": OpCase(lambda: LogSoftmax(1), [(1, 10, 4)]),
    "sdpa": OpCase(Sdpa, [(1, 2, 8, 16)] * 3),
    "self_attention": OpCase(SelfAttention, [(1, 8, 16)]),
    "softmax_masked_fill_inf": OpCase(CausalSoftmax, [(1, 2, 6, 6)]),
    "attention_fused_qkv": OpCase(FusedQkvAttention, [(1, 20, 24)]),
    "avg_pool2d_4x4": OpCase(lambda: nn.AvgPool2d(4, 4), [(1, 8, 8, 8)]),
    "avg_pool2d_pad_counted": OpCase(lambda: nn.AvgPool2d(3, 1, 1), [(1, 4, 8, 8)]),
    "avg_pool2d_12x12_valid": OpCase(lambda: nn.AvgPool2d(12, 1), [(1, 4, 14, 14)]),
    "avg_pool2d_9x9_pad4": OpCase(lambda: nn.AvgPool2d(9, 1, 4), [(1, 4, 9, 9)]),
    "avg_pool2d_pad_excluded": OpCase(lambda: nn.AvgPool2d(3, 2, 1, count_include_pad=False), [(1, 4, 9, 9)]),
    "avg_pool2d_uneven": OpCase(lambda: nn.AvgPool2d(2, 2), [(1, 4, 9, 9)]),
    "adaptive_avg_pool2d_2x2": OpCase(lambda: nn.AdaptiveAvgPool2d(2), [(1, 8, 8, 8)]),
    "adaptive_avg_pool2d_3x2": OpCase(lambda: nn.AdaptiveAvgPool2d((3, 2)), [(1, 4, 9, 8)]),
    "adaptive_max_pool2d_2x2": OpCase(lambda: nn.AdaptiveMaxPool2d(2), [(1, 8, 8, 8)]),
    "upsample_nearest_2x": OpCase(lambda: nn.Upsample(scale_factor=2), [(1, 4, 5, 5)]),
    "upsample_nearest_4x2": OpCase(lambda: nn.Upsample(scale_factor=(4, 2)), [(1, 4, 3, 4)]),
    "upsample_nearest_3x": OpCase(lambda: nn.Upsample(scale_factor=3), [(1, 4, 4, 4)]),
    "upsample_nearest_3x1": OpCase(lambda: nn.Upsample(scale_factor=(3, 1)), [(1, 4, 4, 5)]),
    # ratios that are no integer (GhostNetV3's gate: 3x3 -> 7x7): Ethos-U85 only
    "upsample_nearest_3_to_7": OpCase(lambda: nn.Upsample(size=(7, 7)), [(1, 4, 3, 3)], ("fp", "int", "u85")),
    "upsample_nearest_5x4_to_8x12": OpCase(lambda: nn.Upsample(size=(8, 12)), [(1, 3, 5, 4)], ("fp", "int", "u85")),
    "upsample_bilinear_3_to_7": OpCase(lambda: nn.Upsample(size=(7, 7), mode="bilinear"), [(1, 4, 3, 3)],
                                       ("fp", "int", "u85")),
    "upsample_bilinear_2x": OpCase(lambda: nn.Upsample(scale_factor=2, mode="bilinear"), [(1, 4, 5, 5)]),
    "upsample_bilinear_4x": OpCase(lambda: nn.Upsample(scale_factor=4, mode="bilinear"), [(1, 4, 3, 3)]),
    "upsample_bilinear_3x2": OpCase(lambda: nn.Upsample(scale_factor=(3, 2), mode="bilinear"), [(1, 3, 4, 5)]),
    "upsample_bilinear_1x5": OpCase(lambda: nn.Upsample(scale_factor=(1, 5), mode="bilinear"), [(1, 2, 3, 4)]),
    "upsample_bilinear_16x": OpCase(lambda: nn.Upsample(scale_factor=16, mode="bilinear"), [(1, 3, 3, 2)]),
    "lstm_2layer_batch_first": OpCase(lambda: Recurrent(nn.LSTM, 2, True), [(1, 8, 16)]),
    "lstm_1layer_seq_first": OpCase(lambda: Recurrent(nn.LSTM, 1, False), [(4, 1, 16)]),
    "gru_2layer_batch_first": OpCase(lambda: Recurrent(nn.GRU, 2, True), [(1, 4, 16)]),
    "gru_1layer_seq_first": OpCase(lambda: Recurrent(nn.GRU, 1, False), [(4, 1, 16)]),
    "gru_bidirectional": OpCase(lambda: Recurrent(nn.GRU, 1, True, True), [(1, 3, 16)]),
    "lstm_bidirectional": OpCase(lambda: Recurrent(nn.LSTM, 1, False, True), [(3, 1, 16)]),
}

TABLE = OpTable("ops_layers", CASES)


class TokenEmbedding(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)

    def forward(self, tokens):
        return self.emb(tokens)


TOKENS = (torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]], dtype=torch.int32),)
