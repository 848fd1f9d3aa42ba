"""MobileNetV3-Small (Howard et al. 2019): hardswish, squeeze-and-excitation, 224x224."""

from __future__ import annotations

import torch
from torch import nn

from ._init import init_weights

# kernel, expanded channels, output channels, squeeze-excite, activation ("RE" relu, "HS" hardswish), stride
SETTINGS = (
    (3, 16, 16, True, "RE", 2), (3, 72, 24, False, "RE", 2), (3, 88, 24, False, "RE", 1),
    (5, 96, 40, True, "HS", 2), (5, 240, 40, True, "HS", 1), (5, 240, 40, True, "HS", 1),
    (5, 120, 48, True, "HS", 1), (5, 144, 48, True, "HS", 1), (5, 288, 96, True, "HS", 2),
    (5, 576, 96, True, "HS", 1), (5, 576, 96, True, "HS", 1),
)


def _act(kind: str) -> nn.Module:
    return nn.Hardswish() if kind == "HS" else nn.ReLU()


def conv_bn_act(cin, cout, kernel, stride=1, groups=1, act="RE") -> nn.Sequential:
    layers = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, _act(act)) if act else nn.Sequential(*layers)


class SqueezeExcite(nn.Module):
    """Channel attention: global average, bottleneck, hardsigmoid gate."""

    def __init__(self, channels: int):
        super().__init__()
        squeeze = max(8, (channels // 4 + 4) // 8 * 8)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.relu = nn.ReLU()
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        return x * self.gate(self.fc2(self.relu(self.fc1(self.pool(x)))))


class Block(nn.Module):
    def __init__(self, cin, kernel, hidden, cout, se, act, stride):
        super().__init__()
        self.use_res = stride == 1 and cin == cout
        layers = [] if hidden == cin else [conv_bn_act(cin, hidden, 1, act=act)]
        layers.append(conv_bn_act(hidden, hidden, kernel, stride, groups=hidden, act=act))
        if se:
            layers.append(SqueezeExcite(hidden))
        layers.append(conv_bn_act(hidden, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.block(x) if self.use_res else self.block(x)


class MobileNetV3Small(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        layers = [conv_bn_act(3, 16, 3, 2, act="HS")]
        cin = 16
        for kernel, hidden, cout, se, act, stride in SETTINGS:
            layers.append(Block(cin, kernel, hidden, cout, se, act, stride))
            cin = cout
        layers.append(conv_bn_act(cin, 576, 1, act="HS"))
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(1024, num_classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def build(seed: int = 0) -> tuple[nn.Module, tuple]:
    torch.manual_seed(seed)
    model = init_weights(MobileNetV3Small(), seed, torch.randn(8, 3, 224, 224))
    return model, (torch.randn(1, 3, 224, 224),)
