"""The valid programs the fuzzers damage: small, fast to run, and together covering every part of a .pte
the host runtime reads — CPU kernels of every value kind, quantized I/O, and TOSA, Ethos-U (U55, U85)
and VGF delegates with their carried TOSA."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tosakit.errors import write_atomic
from tosakit.flow import compile
from tosakit.specs import compile_spec_for_target


class SmallNet(nn.Module):
    """conv, relu, pool, linear: what every delegate takes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.avg_pool2d(torch.relu(self.conv(x)), 2), 1))


class ListNet(nn.Module):
    """Kernels whose values are lists and several outputs: split, max-pool with indices, layer norm, cat."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        a, b = torch.split(x, [4, 4], dim=-1)
        pooled, indices = nn.functional.max_pool2d(x, 2, return_indices=True)
        return torch.cat([self.norm(x), b, a], dim=-1), pooled, indices


# name -> (model, target, quantize, delegate, carry TOSA)
SEEDS = {
    "cpu_fp": (SmallNet, "TOSA-1.0+FP", False, False, False),
    "cpu_int": (SmallNet, "ethos-u55-128", True, False, False),
    "cpu_lists": (ListNet, "TOSA-1.0+FP", False, False, False),
    "tosa_fp": (SmallNet, "TOSA-1.0+FP", False, True, False),
    "tosa_int": (SmallNet, "TOSA-1.0+INT", True, True, False),
    "ethos_u55": (SmallNet, "ethos-u55-128", True, True, True),
    "ethos_u55_payload_only": (SmallNet, "ethos-u55-128", True, True, False),
    "ethos_u85": (SmallNet, "ethos-u85-256", True, True, True),
    "vgf": (SmallNet, "vgf", False, True, True),
}


def build_seeds(folder: Path) -> list[Path]:
    """Write every seed program into ``folder`` (kept when already there); their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, (model_cls, target, quantize, delegate, carry) in SEEDS.items():
        path = folder / f"{name}.pte"
        if not path.exists():
            torch.manual_seed(0)
            model = model_cls().eval()
            inputs = (torch.randn(1, 3, 8, 8),)
            spec = compile_spec_for_target(target)
            spec.embed_tosa = carry
            compiled = compile(model, inputs, spec, quantize=quantize, delegate=delegate)
            write_atomic(path, compiled.program.buffer)
        paths.append(path)
    return paths
