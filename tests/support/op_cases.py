"""The op tables' machinery: a case is data (module factory, inputs, flavours), a table a named dict of cases
that the one family of op tests (tests/lower/test_ops.py) and the sweeps beyond it (CPU programs, the
simulator's configurations) run; inputs are seeded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pytest
import torch

ALL = ("fp", "int", "u55", "u85")


class Fn(torch.nn.Module):
    """A module that applies ``fn`` to its inputs."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


class Atan2(torch.nn.Module):
    """A float op no target lowers (atan2), between quantized layers taking ``width`` features."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.first, self.second = torch.nn.Linear(width, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        y = self.first(x)
        return self.second(torch.atan2(y, y + 3))


def seed_inputs(*shapes) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(*s, generator=g) for s in shapes)


def positive_inputs(*shapes) -> tuple[torch.Tensor, ...]:
    """Seeded inputs in [0.25, 2.25) (for log, sqrt, division, ...)."""
    g = torch.Generator().manual_seed(0)
    return tuple(torch.rand(*s, generator=g) * 2 + 0.25 for s in shapes)


@dataclass(frozen=True)
class OpCase:
    """One op test: ``factory`` builds the module (after ``torch.manual_seed(0)``); ``inputs`` are shapes of seeded
    floats (positive ones with ``positive``) or tensors taken as they are (int32 indices); ``flavours`` the ways it
    runs (fp, int, u55, u85). ``tosa_op`` is the TOSA op a delegate must hold (16-bit tables); ``u55_reason`` the
    reason the partitioner gives for keeping it off Ethos-U55/U65 when the U55 is not among its flavours."""

    factory: Callable[[], torch.nn.Module]
    inputs: tuple
    flavours: tuple[str, ...] = ALL
    positive: bool = False
    tosa_op: str | None = None
    u55_reason: str | None = None

    def build(self) -> tuple[torch.nn.Module, tuple]:
        """The eval-mode module and its seeded inputs."""
        shapes = [s for s in self.inputs if not isinstance(s, torch.Tensor)]
        floats = iter(positive_inputs(*shapes) if self.positive else seed_inputs(*shapes))
        torch.manual_seed(0)
        module = self.factory().eval()
        return module, tuple(s.clone() if isinstance(s, torch.Tensor) else next(floats) for s in self.inputs)


@dataclass(frozen=True)
class OpTable:
    """A named table of op cases. ``config`` makes the quantization config its quantized flavours use (None: the
    default int8); every reason for keeping a case off the U55 names ``u55_limit``; ``u85_seeds``, where the op tests
themselves simulate its Ethos-U85 streams (the int8 tables' run in test_ethosu_sim)."""

    name: str
    cases: dict[str, OpCase]
    config: Callable[[], object] | None = None
    u55_limit: str = "Ethos-U55/U65 TOSA subset"
    u85_seeds: tuple[int, ...] = ()

    @property
    def flavours(self) -> dict[str, tuple[str, ...]]:
        return {name: case.flavours for name, case in self.cases.items()}

    def build(self, name: str) -> tuple[torch.nn.Module, tuple]:
        return self.cases[name].build()

    def compile_kw(self) -> dict:
        """``compile``'s quantization keywords for this table."""
        return {"config": self.config()} if self.config is not None else {}

    def params(self, flavour: str) -> list:
        """One pytest param (table, case name) per case that runs in ``flavour``, its id ``<table>.<name>``."""
        return [pytest.param(self, name, id=f"{self.name}.{name}") for name, case in self.cases.items()
                if flavour in case.flavours]

    def refused_params(self) -> list:
        """The cases Ethos-U85 runs and Ethos-U55/U65 refuse."""
        return [pytest.param(self, name, id=f"{self.name}.{name}") for name, case in self.cases.items()
                if "u85" in case.flavours and "u55" not in case.flavours]


# The networks ExecuTorch's Arm backend tests end to end, in the zoo for test_zoo's four flavours, the simulator
# (test_ethosu_sim) and ExecuTorch's runtime (test_cpu_programs). The other whole-model sweeps (run and verify,
# NPU engine, per-operation checks, ExecuTorch's own export) run the zoo's original models, whose ops these share.
EXECUTORCH_TESTED = {"ds_cnn", "resnet8", "mobilenet_v1_025", "deep_autoencoder", "wav2letter", "conformer", "crnn",
                     "yolo"}


def sweep_models() -> list[str]:
    """The built-in models the generic whole-model sweeps run."""
    from tosakit.zoo import MODELS

    return [m for m in MODELS if m not in EXECUTORCH_TESTED]
