"""The memory system an Ethos-U delegate runs in, as Vela was told it: the system config and memory mode of its
compile flags, read from Vela's own ``Arm/vela.ini``; which memory (and AXI port) each of the command stream's
regions lives in, and each memory's bandwidth, latency and burst length in NPU cycles."""

from __future__ import annotations

from dataclasses import dataclass

from ...backends.ethosu.vela_options import VelaConfig, VelaOptions
from ...errors import TosakitError
from ...targets import ETHOSU_TARGETS
from .hardware import Accelerator

# Region -> the memory mode's area holding it: 0 the read-only data, 1 the arena, 2 the fast scratch (staging).
REGION_AREAS = {0: "const", 1: "arena", 2: "cache"}


@dataclass(frozen=True)
class MemoryPort:
    """One memory as the NPU sees it: its name in vela.ini (Sram, Dram, OffChipFlash, OnChipFlash), the AXI port it
    is on, bytes per NPU cycle, read and write latency (cycles), burst length (bytes), outstanding transactions."""

    name: str
    axi: int
    bandwidth: float
    read_latency: int
    write_latency: int
    burst: int
    ports: int
    max_reads: int
    max_writes: int


@dataclass(frozen=True)
class MemorySystem:
    """The system config and memory mode a delegate was compiled for, and each region's memory."""

    system_config: str
    memory_mode: str
    clock_hz: float
    regions: dict[int, MemoryPort]

    def memory(self, region: int) -> MemoryPort:
        """Region ``region``'s memory (an unmapped region: the arena's)."""
        return self.regions.get(region, self.regions[1])


def _port(config: VelaConfig, name: str, axi: int, axi_bytes: int) -> MemoryPort:
    section = config.system

    def number(key: str, default: float, kind=float, minimum: float = 0.0):
        return config.number(section, f"{name}_{key}", default, kind, minimum, "a number")

    ports = max(1, number("ports_used", 1, int))
    return MemoryPort(name, axi, number("clock_scale", 1.0) * axi_bytes * ports, number("read_latency", 1, int),
                      number("write_latency", 1, int), number("burst_length", 64, int, 1), ports,
                      max(1, number("max_reads", 1, int)), max(1, number("max_writes", 1, int)))


def compile_flags(compile_specs) -> list[str]:
    """The Vela flags an Ethos-U delegate's compile specs carry (its "compile_flags" entry)."""
    value = next((bytes(s.value) for s in compile_specs if s.key == "compile_flags"), b"")
    return value.decode(errors="replace").split()


def memory_system(flags: list[str], accelerator: Accelerator) -> MemorySystem:
    """The memory system the Vela flags stored with a delegate name (``--system-config``, ``--memory-mode``), from
    Vela's own vela.ini (a file a program names is not read); the target's defaults where they name none, or one
    vela.ini lacks."""
    target = ETHOSU_TARGETS[accelerator.name]
    opts = VelaOptions(accelerator=accelerator.name, system_config=target.system_config,
                       memory_mode=target.memory_mode)
    for flag in flags:
        key, _, value = flag.partition("=")
        if key == "--system-config" and value:
            opts.system_config = value
        elif key == "--memory-mode" and value:
            opts.memory_mode = value
    try:
        config = VelaConfig(opts)
    except TosakitError:
        opts.system_config, opts.memory_mode = target.system_config, target.memory_mode
        config = VelaConfig(opts)
    # Vela's AXI width: 8 bytes for the Ethos-U55 system configs, 16 for the others
    axi_bytes = 8 if config.system.split(".", 1)[1].startswith("Ethos_U55") else 16
    ports = {axi: _port(config, config.get(config.system, f"axi{axi}_port", "Sram"), axi, axi_bytes)
             for axi in (0, 1)}
    regions = {region: ports[int(config.get(config.mode, f"{area}_mem_area", "Axi0")[-1])]
               for region, area in REGION_AREAS.items()}
    return MemorySystem(opts.system_config, opts.memory_mode, config.clock_hz, regions)
