"""The host runtime's records: what a program's tensors are, how its two engines compare on a delegate, and the
Ethos-U delegate call a per-operation check is handed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..program import schema as S
from .tosa_sandbox import IsolatedReferenceModel


@dataclass(frozen=True)
class TensorSpec:
    """What the program expects of an input (or produces as an output)."""

    scalar_type: S.ScalarType
    shape: tuple[int, ...]

    @property
    def dtype(self):
        """The torch dtype."""
        return S.torch_dtype_of(self.scalar_type)

    def __str__(self) -> str:
        return f"{S.ELEMENT_TYPES[self.scalar_type][0]}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class EngineComparison:
    """One output of one delegate call computed both ways on the same inputs: the simulated command stream or the
    VGF engine (whose result the program goes on with) and the carried TOSA on the reference model."""

    delegate: int
    backend: str
    output: int
    values: int
    equal: int
    max_abs_diff: float

    @property
    def bit_exact(self) -> bool:
        return self.equal == self.values

    def __str__(self) -> str:
        verdict = "bit-exact" if self.bit_exact else (f"{self.values - self.equal} differ, max |diff| "
                                                      f"{self.max_abs_diff:g}")
        return (f"delegate {self.delegate} ({self.backend}) output {self.output}: {self.equal} of {self.values} "
                f"values equal ({verdict})")


@dataclass(frozen=True)
class NpuCall:
    """A simulated Ethos-U delegate call that carries its TOSA, as a per-operation check gets it
    (``LoadedProgram.run_and_check``)."""

    name: str  # "delegate 3"
    payload: bytes  # the delegate's bytes
    tosa: bytes
    compile_specs: list
    inputs: list[np.ndarray]  # its inputs as stored, one integer array each
    sandbox: IsolatedReferenceModel | None  # the child process that runs a file from anywhere; None: this process


@dataclass(frozen=True)
class Step:
    """One instruction of a profiled run: its index, what it called (a kernel's event name, a delegate's backend),
    its host time (ns); for a delegate call its index, the engine that ran it and, when the Ethos-U simulator did,
    each NPU operation's estimate (``ethosu.profile.NpuProfile``)."""

    instruction: int
    name: str
    host_ns: int
    delegate: int | None = None
    engine: str | None = None
    npu: object | None = None
