"""A YOLO-style detector (YOLOv5's layout at a small size): strided conv + SiLU backbone, a neck that upsamples
(nearest, x2) and concatenates, and two detection heads whose outputs are decoded in the model — per anchor and
cell, sigmoid, the cell's grid offset and the anchor's size — into boxes [x, y, w, h, objectness, classes...]."""

from __future__ import annotations

import torch
from torch import nn

from ._init import init_weights


def conv(cin: int, cout: int, k: int = 3, s: int = 1) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, s, k // 2, bias=False), nn.BatchNorm2d(cout), nn.SiLU())


class Detect(nn.Module):
    """One scale's head: a 1x1 conv to anchors x (5 + classes) per cell, decoded to boxes in input pixels."""

    def __init__(self, cin: int, classes: int, anchors: list[tuple[float, float]], stride: int, size: int):
        super().__init__()
        self.na, self.no, self.stride = len(anchors), 5 + classes, stride
        self.conv = nn.Conv2d(cin, self.na * self.no, 1)
        cells = size // stride
        y, x = torch.meshgrid(torch.arange(cells), torch.arange(cells), indexing="ij")
        self.register_buffer("grid", torch.stack((x, y), -1).view(1, 1, cells, cells, 2).float() - 0.5)
        self.register_buffer("anchor", torch.tensor(anchors).view(1, self.na, 1, 1, 2))

    def forward(self, x):
        b, _, h, w = x.shape
        p = self.conv(x).view(b, self.na, self.no, h, w).permute(0, 1, 3, 4, 2).sigmoid()
        xy = (p[..., :2] * 2 + self.grid) * self.stride
        wh = (p[..., 2:4] * 2) ** 2 * self.anchor
        return torch.cat((xy, wh, p[..., 4:]), -1).view(b, -1, self.no)


class TinyYolo(nn.Module):
    def __init__(self, classes: int = 4, width: int = 16, size: int = 128):
        super().__init__()
        w = width
        self.stem = nn.Sequential(conv(3, w, 3, 2), conv(w, 2 * w, 3, 2), conv(2 * w, 2 * w))  # /4
        self.down8 = nn.Sequential(conv(2 * w, 4 * w, 3, 2), conv(4 * w, 4 * w))  # /8
        self.down16 = nn.Sequential(conv(4 * w, 8 * w, 3, 2), conv(8 * w, 8 * w))  # /16
        self.lateral = conv(8 * w, 4 * w, 1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.fuse8 = conv(8 * w, 4 * w)
        self.head8 = Detect(4 * w, classes, [(10, 13), (16, 30), (33, 23)], 8, size)
        self.head16 = Detect(8 * w, classes, [(30, 61), (62, 45), (59, 119)], 16, size)

    def forward(self, x):
        p8 = self.down8(self.stem(x))
        p16 = self.down16(p8)
        n8 = self.fuse8(torch.cat([self.up(self.lateral(p16)), p8], 1))
        return torch.cat([self.head8(n8), self.head16(p16)], 1)


def tiny_yolo(seed: int = 0) -> tuple[nn.Module, tuple]:
    torch.manual_seed(seed)
    model = init_weights(TinyYolo(), seed, torch.randn(4, 3, 128, 128))
    return model, (torch.randn(1, 3, 128, 128),)
