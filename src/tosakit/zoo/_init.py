"""Seeded random weights with realistic activation statistics."""

from __future__ import annotations

import torch
from torch import nn


def init_weights(model: nn.Module, seed: int, *calibration_inputs, linear_std: float = 0.02) -> nn.Module:
    """torchvision-style initialisation, then batch-norm statistics measured on random inputs."""
    torch.manual_seed(seed)
    for m in model.modules():
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
