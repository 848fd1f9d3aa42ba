"""Targets: every name ``--target`` takes, parsed once into a record (like Vela's accelerator table).

Specs, Vela's options, the partitioner's limits and the simulator read the record; nothing splits the name
again."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import TosakitError, did_you_mean


@dataclass(frozen=True)
class Target:
    """One compile target: its name and the TOSA it compiles to; for an Ethos-U NPU also its family, MACs per
    cycle (all cores), cores, and the system config and memory mode Vela uses unless told otherwise."""

    name: str
    tosa: str  # the TOSA specification, e.g. "TOSA-1.0+INT+int16+int4+u55"
    family: str | None = None  # "u55", "u65" or "u85" for an Ethos-U NPU
    macs: int = 0
    cores: int = 1
    system_config: str | None = None
    memory_mode: str | None = None

    @property
    def product(self) -> str:
        """The NPU product: "ethos-u55", "ethos-u65" or "ethos-u85"."""
        return f"ethos-{self.family}"

    @property
    def macs_per_core(self) -> int:
        return self.macs // self.cores


# Per Ethos-U family: Vela's default system config and memory mode (as ExecuTorch's Arm backend sets them),
# and the TOSA it takes (U55 and U65 run the u55 subset).
_FAMILIES = {
    "u55": ("Ethos_U55_High_End_Embedded", "Shared_Sram", "TOSA-1.0+INT+int16+int4+u55"),
    "u65": ("Ethos_U65_High_End", "Dedicated_Sram_384KB", "TOSA-1.0+INT+int16+int4+u55"),
    "u85": ("Ethos_U85_SYS_DRAM_Mid", "Sram_Only", "TOSA-1.0+INT+int16+int4+cf"),
}
# (family, MACs per cycle, cores): Vela's accelerator configurations.
_ETHOSU = (("u55", 32, 1), ("u55", 64, 1), ("u55", 128, 1), ("u55", 256, 1), ("u65", 256, 1), ("u65", 512, 2),
           ("u85", 128, 1), ("u85", 256, 1), ("u85", 512, 1), ("u85", 1024, 1), ("u85", 2048, 1))

ETHOSU_TARGETS: dict[str, Target] = {
    f"ethos-{family}-{macs}": Target(f"ethos-{family}-{macs}", _FAMILIES[family][2], family, macs, cores,
                                     *_FAMILIES[family][:2])
    for family, macs, cores in _ETHOSU
}
VGF_TARGET = Target("vgf", "TOSA-1.0+FP+INT+int4+int16")
TOSA_TARGETS = ("TOSA-1.0+INT", "TOSA-1.0+FP")
# Cortex-M cores and the class of CMSIS-NN kernels each runs (ExecuTorch 1.5.1's table): scalar code, the DSP
# extension, or MVE (Helium).
CORTEX_M_ISA = {"cortex-m0": "SCALAR", "cortex-m0plus": "SCALAR", "cortex-m3": "SCALAR", "cortex-m23": "SCALAR",
                "cortex-m4": "DSP", "cortex-m7": "DSP", "cortex-m33": "DSP", "cortex-m35p": "DSP",
                "cortex-m55": "MVE", "cortex-m85": "MVE"}
ALL_TARGETS = (*ETHOSU_TARGETS, VGF_TARGET.name, *TOSA_TARGETS, *CORTEX_M_ISA)


def parse_target(text: str) -> Target:
    """The record of a target name: ``ethos-u55-128`` (any case), ``vgf``, or a TOSA specification."""
    name = text.strip()
    if name.lower() in ETHOSU_TARGETS:
        return ETHOSU_TARGETS[name.lower()]
    if name.lower() == VGF_TARGET.name:
        return VGF_TARGET
    if name.upper().startswith("TOSA-"):
        return Target(name, name)
    raise TosakitError(f"unknown target {text!r}", did_you_mean(name, ALL_TARGETS))
