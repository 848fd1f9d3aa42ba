"""Shared by the per-op test tables (test_ops.py, test_ops_layers.py): a case is
``name -> (module factory, input shapes, flavours)``; inputs are seeded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch


class Fn(torch.nn.Module):
    """A module that applies ``fn`` to its inputs."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


def seed_inputs(*shapes) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*s, generator=g) for s in shapes)


def flavour_params(cases: dict, flavour: str) -> list:
    """One pytest param per case that runs in ``flavour``, its id ``<name>_<flavour>``."""
    return [pytest.param(name, id=f"{name}_{flavour}") for name, (_, _, flavours) in cases.items()
            if flavour in flavours]


def build_case(cases: dict, name: str) -> tuple[torch.nn.Module, tuple]:
    factory, shapes, _ = cases[name]
    torch.manual_seed(0)
    return factory().eval(), seed_inputs(*shapes)


@dataclass(frozen=True)
class OpTable:
    """One test module's op cases, for sweeps beyond it (CPU programs): each case's flavours, and a
    builder ``name -> (eval-mode module, seeded inputs)``."""

    flavours: dict[str, tuple[str, ...]]
    build: Callable[[str], tuple[torch.nn.Module, tuple]]


# The networks ExecuTorch's Arm backend tests end to end, in the zoo for test_zoo's four flavours, the simulator
# (test_ethosu_sim) and ExecuTorch's runtime (test_cpu_programs). The other whole-model sweeps (run and verify,
# NPU engine, per-operation checks, ExecuTorch's own export) run the zoo's original models, whose ops these share.
EXECUTORCH_TESTED = {"ds_cnn", "resnet8", "mobilenet_v1_025", "deep_autoencoder", "wav2letter", "conformer", "crnn",
                     "yolo"}


def sweep_models() -> list[str]:
    """The built-in models the generic whole-model sweeps run."""
    from tosakit.zoo import MODELS

    return [m for m in MODELS if m not in EXECUTORCH_TESTED]
