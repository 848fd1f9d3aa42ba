"""Seeded random weights with realistic activation statistics."""

from __future__ import annotations

import torch
from torch import nn


def init_weights(model: nn.Module, seed: int, *calibration_inputs, linear_std: float = 0.02,
                 channel_gain_spread: float = 0.0) -> nn.Module:
    """torchvision-style initialisation, then batch-norm statistics measured on random inputs.

    ``channel_gain_spread`` gives batch-norm gains a log-normal spread (sigma): trained networks have
    channels whose gains differ by orders of magnitude, which is what per-channel weights are for.
    """
    torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and channel_gain_spread:
            with torch.no_grad():
                m.weight.copy_(torch.exp(torch.randn(m.num_features) * channel_gain_spread))
                m.bias.normal_(0, 0.1)
            continue
        if isinstance(m, (nn.Conv1d, nn.Conv2d)):
            nn.init.kaiming_normal_(m.weight, mode="fan_out")
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, linear_std)
        else:
            continue
        if m.bias is not None:
            nn.init.zeros_(m.bias)
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        model.train()
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.momentum = None  # cumulative average over the calibration batch
        with torch.no_grad():
            model(*calibration_inputs)
    return model.eval()
