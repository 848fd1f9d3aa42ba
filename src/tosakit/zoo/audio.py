"""A 1-D convolutional keyword spotter over 40 MFCC channels and 98 frames (DS-CNN style)."""

from __future__ import annotations

import torch
from torch import nn

from ._init import init_weights

CHANNELS, FRAMES, CLASSES = 40, 98, 12


def block(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Sequential:
    """Depthwise 1-D conv, then pointwise: the separable building block of small audio nets."""
    return nn.Sequential(
        nn.Conv1d(cin, cin, kernel, stride, kernel // 2, groups=cin, bias=False), nn.BatchNorm1d(cin), nn.ReLU(),
        nn.Conv1d(cin, cout, 1, bias=False), nn.BatchNorm1d(cout), nn.ReLU(),
    )


class AudioNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv1d(CHANNELS, 64, 5, 2, 2, bias=False), nn.BatchNorm1d(64), nn.ReLU())
        self.blocks = nn.Sequential(block(64, 64, 9), block(64, 96, 9, 2), block(96, 96, 9), block(96, 128, 9, 2))
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.fc = nn.Linear(128, CLASSES)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def build(seed: int = 0) -> tuple[nn.Module, tuple]:
    torch.manual_seed(seed)
    model = init_weights(AudioNet(), seed, torch.randn(8, CHANNELS, FRAMES))
    return model, (torch.randn(1, CHANNELS, FRAMES),)
