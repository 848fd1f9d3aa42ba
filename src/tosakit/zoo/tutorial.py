"""The small modules of the Arm backend tutorial."""

from __future__ import annotations

import torch


class AddModule(torch.nn.Module):
    """x + x; integer inputs let the Ethos-U run it without quantization."""

    def forward(self, x):
        return x + x


class AddModule3(torch.nn.Module):
    """Two inputs, two outputs."""

    def forward(self, x, y):
        return x + y, x + x


class SoftmaxModule(torch.nn.Module):
    """A single softmax: a float op the Ethos-U leaves to the CPU."""

    def __init__(self):
        super().__init__()
        self.softmax = torch.nn.Softmax(dim=-1)

    def forward(self, x):
        return self.softmax(x)


def add():
    return AddModule(), (torch.ones(5, dtype=torch.int32),)


def add3():
    g = torch.Generator().manual_seed(0)
    return AddModule3(), (torch.randn(5, generator=g), torch.randn(5, generator=g))


def softmax():
    return SoftmaxModule(), (torch.ones(2, 2),)
