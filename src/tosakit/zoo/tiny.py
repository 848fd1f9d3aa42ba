"""MLPerf Tiny's reference networks, written after the benchmark's published architectures (random weights): DS-CNN
(keyword spotting on 49x10 MFCCs), ResNet-8 (CIFAR-10 at 32x32), MobileNetV1 0.25 (visual wake words at 96x96)
and the Deep AutoEncoder (machine-sound anomaly detection on 640 log-mel features)."""

from __future__ import annotations

import torch
from torch import nn

from ._init import init_weights


def _conv_bn(cin: int, cout: int, kernel, stride=1, padding=0, groups: int = 1, relu: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, nn.ReLU()) if relu else nn.Sequential(*layers)


def _separable(cin: int, cout: int, stride: int = 1) -> nn.Sequential:
    """Depthwise 3x3 then pointwise 1x1, each with batch norm and ReLU."""
    return nn.Sequential(_conv_bn(cin, cin, 3, stride, 1, groups=cin), _conv_bn(cin, cout, 1))


class DsCnn(nn.Module):
    """DS-CNN (small): a 10x4 stride-2 convolution to 64 channels, four depthwise-separable blocks, average pool over
    the whole map, 12 keyword classes."""

    def __init__(self, classes: int = 12, channels: int = 64):
        super().__init__()
        self.features = nn.Sequential(_conv_bn(1, channels, (10, 4), 2, (5, 1)),
                                      *(_separable(channels, channels) for _ in range(4)))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(channels, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class _Residual(nn.Module):
    """Two 3x3 convolutions and a shortcut (a strided 1x1 convolution, no batch norm, where the shape changes),
    then ReLU."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(_conv_bn(cin, cout, 3, stride, 1), _conv_bn(cout, cout, 3, 1, 1, relu=False))
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Conv2d(cin, cout, 1, stride, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet8(nn.Module):
    """ResNet-8: a 3x3 stem to 16 channels, three residual stacks (16, 32, 64 channels; the last two halve the
    map), an 8x8 average pool, 10 classes."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.stem = _conv_bn(3, 16, 3, 1, 1)
        self.stacks = nn.Sequential(_Residual(16, 16, 1), _Residual(16, 32, 2), _Residual(32, 64, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(64, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.stacks(self.stem(x))), 1))


# MobileNetV1's depthwise-separable blocks at width 1.0: (output channels, stride).
_MOBILENET_V1 = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), *((512, 1),) * 5, (1024, 2), (1024, 1))


class MobileNetV1(nn.Module):
    """MobileNetV1 at a width multiplier (0.25 for visual wake words: 8 to 256 channels), 2 classes."""

    def __init__(self, width: float = 0.25, classes: int = 2):
        super().__init__()
        cin = int(32 * width)
        layers = [_conv_bn(3, cin, 3, 2, 1)]
        for channels, stride in _MOBILENET_V1:
            layers.append(_separable(cin, int(channels * width), stride))
            cin = int(channels * width)
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(cin, classes)

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class DeepAutoEncoder(nn.Module):
    """Dense 640 -> 128 (x4) -> 8 -> 128 (x4) -> 640, batch norm and ReLU after every layer but the last."""

    def __init__(self, features: int = 640, hidden: int = 128, bottleneck: int = 8):
        super().__init__()
        sizes = [features, *(hidden,) * 4, bottleneck, *(hidden,) * 4]
        layers = []
        for cin, cout in zip(sizes, sizes[1:]):
            layers += [nn.Linear(cin, cout), nn.BatchNorm1d(cout), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(hidden, features))

    def forward(self, x):
        return self.net(x)


def _build(model: nn.Module, *shape: int) -> tuple[nn.Module, tuple]:
    """The model with seeded weights, batch norms measured on 8 random samples, and an example input."""
    torch.manual_seed(0)
    calibration, inputs = torch.randn(8, *shape[1:]), (torch.randn(*shape),)
    return init_weights(model, 0, calibration, channel_gain_spread=0.5), inputs


def ds_cnn():
    return _build(DsCnn(), 1, 1, 49, 10)


def resnet8():
    return _build(ResNet8(), 1, 3, 32, 32)


def mobilenet_v1_025():
    return _build(MobileNetV1(0.25), 1, 3, 96, 96)


def deep_autoencoder():
    return _build(DeepAutoEncoder(), 1, 640)
