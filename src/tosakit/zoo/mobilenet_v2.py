"""MobileNetV2 (Sandler et al. 2018), width 1.0, written here so no torchvision is needed."""

from __future__ import annotations

import torch
from torch import nn

from ._init import init_weights

# expansion t, output channels c, repeats n, first stride s
SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def conv_bn(cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1, relu6: bool = True) -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if relu6:
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    """Expand (1x1), depthwise (3x3), project (1x1, linear); residual when shapes allow."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        layers = [] if expand == 1 else [conv_bn(cin, hidden, 1)]
        layers += [conv_bn(hidden, hidden, 3, stride, groups=hidden), conv_bn(hidden, cout, 1, relu6=False)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers = [conv_bn(3, 32, 3, 2)]
        cin = 32
        for t, c, n, s in SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(conv_bn(cin, 1280, 1))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def build(seed: int = 0) -> tuple[nn.Module, tuple]:
    """Seeded random weights (torchvision's init, trained-like spread of channel gains), batch-norm
    statistics from random images."""
    torch.manual_seed(seed)
    model = MobileNetV2()
    init_weights(model, seed, torch.randn(8, 3, 224, 224), linear_std=0.01, channel_gain_spread=1.0)
    return model, (torch.randn(1, 3, 224, 224),)
