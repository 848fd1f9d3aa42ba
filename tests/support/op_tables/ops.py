"""The first op table: convolutions, linear layers, arithmetic, activations, pooling, reshapes."""

from __future__ import annotations

import torch
from torch import nn

from support.op_cases import OpCase, OpTable


class Add(nn.Module):
    def forward(self, x, y):
        return x + y


class AddScalar(nn.Module):
    def forward(self, x):
        return x + 0.5


class AddBroadcast(nn.Module):
    def forward(self, x, y):
        return x + y  # y: [1, C, 1, 1]


class AddRelu(nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)


class Sub(nn.Module):
    def forward(self, x, y):
        return x - y


class Mul(nn.Module):
    def forward(self, x, y):
        return x * y


class Relu(nn.Module):
    def forward(self, x):
        return torch.relu(x)


class Hardtanh(nn.Module):
    def forward(self, x):
        return nn.functional.hardtanh(x, -0.5, 1.5)


class Relu6(nn.Module):
    def forward(self, x):
        return nn.functional.relu6(x * 4)


class ConvBnRelu6(nn.Module):
    """Conv with batch norm folded into it and a fused ReLU6 (MobileNet's block)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.act = nn.ReLU6()
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Mean(nn.Module):
    def __init__(self, dims, keepdim):
        super().__init__()
        self.dims, self.keepdim = dims, keepdim

    def forward(self, x):
        return x.mean(self.dims, keepdim=self.keepdim)


class RMSNorm(nn.Module):
    """Hugging Face's RMS norm (Llama, Qwen2, ...): the mean of squares, written out."""

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class Flatten(nn.Module):
    def forward(self, x):
        return torch.flatten(torch.relu(x), 1)


class ViewReshape(nn.Module):
    def forward(self, x):
        y = x.view(x.shape[0], -1, 4)
        return y.reshape(x.shape[0], 4, -1) * 2


class Permute(nn.Module):
    def forward(self, x):
        return torch.relu(x.permute(0, 2, 3, 1)).reshape(1, -1)


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class Sigmoid(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x)


CASES = {
    "conv2d_bias": OpCase(lambda: nn.Conv2d(8, 16, 3, 1, 1), [(1, 8, 16, 16)]),
    "conv2d_stride2_pad1": OpCase(lambda: nn.Conv2d(8, 16, 3, 2, 1), [(1, 8, 17, 17)]),
    "conv2d_1x1_nobias": OpCase(lambda: nn.Conv2d(16, 32, 1, bias=False), [(1, 16, 8, 8)]),
    "conv2d_5x5_pad2": OpCase(lambda: nn.Conv2d(4, 8, 5, 1, 2), [(1, 4, 12, 12)]),
    "conv2d_depthwise": OpCase(lambda: nn.Conv2d(16, 16, 3, 1, 1, groups=16), [(1, 16, 12, 12)]),
    "conv2d_depthwise_stride2": OpCase(lambda: nn.Conv2d(16, 16, 3, 2, 1, groups=16, bias=False), [(1, 16, 14, 14)]),
    "conv2d_depthwise_multiplier": OpCase(lambda: nn.Conv2d(8, 16, 3, 1, 1, groups=8), [(1, 8, 10, 10)]),
    "conv2d_bn_relu6": OpCase(ConvBnRelu6, [(1, 8, 12, 12)]),
    "conv1d": OpCase(lambda: nn.Conv1d(8, 16, 3, 1, 1), [(1, 8, 32)]),
    "linear": OpCase(lambda: nn.Linear(32, 16), [(2, 32)]),
    "linear_3d": OpCase(lambda: nn.Linear(16, 8), [(1, 5, 16)]),
    "linear_relu": OpCase(lambda: nn.Sequential(nn.Linear(32, 16), nn.ReLU()), [(1, 32)]),
    "add": OpCase(Add, [(1, 8, 6, 6), (1, 8, 6, 6)]),
    "add_scalar": OpCase(AddScalar, [(1, 8, 6, 6)]),
    "add_broadcast": OpCase(AddBroadcast, [(1, 8, 6, 6), (1, 8, 1, 1)]),
    "add_relu": OpCase(AddRelu, [(2, 16), (2, 16)]),
    "sub": OpCase(Sub, [(1, 4, 5, 5), (1, 4, 5, 5)]),
    "mul": OpCase(Mul, [(1, 4, 5, 5), (1, 4, 5, 5)]),
    "relu": OpCase(Relu, [(1, 8, 5, 5)]),
    "hardtanh": OpCase(Hardtanh, [(1, 8, 5, 5)]),
    "relu6": OpCase(Relu6, [(1, 8, 5, 5)]),
    "adaptive_avg_pool2d": OpCase(lambda: nn.AdaptiveAvgPool2d(1), [(1, 16, 7, 7)]),
    "mean_hw_keepdim": OpCase(lambda: Mean((2, 3), True), [(1, 8, 6, 6)]),
    "mean_hw": OpCase(lambda: Mean((-1, -2), False), [(1, 8, 6, 6)]),
    "mean_last": OpCase(lambda: Mean((-1,), True), [(1, 4, 16)]),
    # the mean of squares quantized on its own range, not its input's: a division by 64 of a shared scale tied
    # at every other sum (TOSA rounds ties up, torch to even) and the program left the fake-quantized model
    "rms_norm": OpCase(RMSNorm, [(1, 256, 64)]),
    "avg_pool2d": OpCase(lambda: nn.AvgPool2d(2, 2), [(1, 8, 8, 8)]),
    "max_pool2d": OpCase(lambda: nn.MaxPool2d(3, 2, 1), [(1, 8, 9, 9)]),
    # ceil mode (SqueezeNet's and GoogLeNet's pools): windows past the edge cover what is left of the input
    "max_pool2d_ceil": OpCase(lambda: nn.MaxPool2d(3, 2, ceil_mode=True), [(1, 8, 14, 14)]),
    "max_pool2d_ceil_2x2": OpCase(lambda: nn.MaxPool2d(2, 2, ceil_mode=True), [(1, 8, 7, 9)]),
    "max_pool2d_ceil_padded": OpCase(lambda: nn.MaxPool2d(3, 2, 1, ceil_mode=True), [(1, 8, 10, 10)]),
    "avg_pool2d_ceil": OpCase(lambda: nn.AvgPool2d(3, 2, ceil_mode=True), [(1, 8, 8, 8)]),
    "avg_pool2d_ceil_padded": OpCase(lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True), [(1, 8, 8, 8)]),
    "avg_pool2d_ceil_pad_not_counted": OpCase(
        lambda: nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False), [(1, 8, 8, 8)]),
    "flatten": OpCase(Flatten, [(1, 8, 2, 2)]),
    "view_reshape": OpCase(ViewReshape, [(2, 4, 8)]),
    "permute": OpCase(Permute, [(1, 4, 3, 5)]),
    "softmax": OpCase(Softmax, [(2, 10)], ("fp",)),
    "sigmoid": OpCase(Sigmoid, [(1, 4, 8)]),
}

TABLE = OpTable("ops", CASES)
