"""A small U-Net for segmentation: downsampling convs, upsampling, skip concatenation."""

from __future__ import annotations

import torch
from torch import nn

from ._init import init_weights


def double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())


class UNet(nn.Module):
    def __init__(self, classes: int = 4, width: int = 16):
        super().__init__()
        w = width
        self.enc1, self.enc2, self.enc3 = double_conv(3, w), double_conv(w, 2 * w), double_conv(2 * w, 4 * w)
        self.pool = nn.MaxPool2d(2)
        self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.dec2 = double_conv(4 * w + 2 * w, 2 * w)
        self.up_nearest = nn.Upsample(scale_factor=2, mode="nearest")
        self.dec1 = double_conv(2 * w + w, w)
        self.head = nn.Conv2d(w, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        e3 = self.enc3(self.pool(e2))
        d2 = self.dec2(torch.cat([self.up(e3), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up_nearest(d2), e1], dim=1))
        return self.head(d1)


def build(seed: int = 0) -> tuple[nn.Module, tuple]:
    torch.manual_seed(seed)
    model = init_weights(UNet(), seed, torch.randn(4, 3, 64, 64))
    return model, (torch.randn(1, 3, 64, 64),)
