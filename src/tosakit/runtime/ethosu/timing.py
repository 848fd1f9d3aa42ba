"""The performance model: an estimate of each NPU operation's cycles from the registers its command set, the way
Vela 5.2 estimates an operation when it compiles one (regor's model, read from its sources, written here anew):
compute cycles per OFM block from the block configuration, microblocks and kernel; the output stage's cycles per
element; and each memory's access cycles from the bytes moved at its bandwidth and burst efficiency. An
operation takes the larger of its compute cycles and its slowest memory's. These are estimates, never measurements."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .featuremap import FeatureMap
from .hardware import CHANNELS, U85_DIV_CYCLES, Accelerator
from .system import MemoryPort, MemorySystem


@dataclass
class Cost:
    """One operation's estimate: compute cycles (MAC, output stage and command issue, with the first and last
    block's memory latency), MAC-active cycles, weight-decoder cycles, MACs, the bytes it moves (``traffic``)
    and its output stage's cycles per element (``ao``: what it adds to the operation chained before it)."""

    compute: int = 0
    mac: int = 0
    weight_decode: int = 0
    macs: int = 0
    traffic: "Traffic | None" = None
    ao: float = 0.0

    @property
    def access(self) -> dict[str, int]:
        """Access cycles per memory."""
        return self.traffic.cycles() if self.traffic is not None else {}

    @property
    def cycles(self) -> int:
        """The slowest of compute, each memory's accesses and the weight decoder (Ethos-U85), which all overlap."""
        return max(self.compute, self.weight_decode, *self.access.values(), 0)

    @property
    def bound_by(self) -> str:
        """"compute", the weight decoder, or the memory whose accesses take longest, whichever sets the cycles."""
        sides = {"compute": self.compute, "weight decoder": self.weight_decode, **self.access}
        return max(sides, key=sides.get)


def ceil_div(a: int, b: int) -> int:
    """a / b rounded up."""
    return -(-a // b)


def round_up(a: int, b: int) -> int:
    """a rounded up to a multiple of b."""
    return ceil_div(a, b) * b


def volume(shape) -> int:
    """Elements of ``shape``."""
    return math.prod(shape)


@dataclass(frozen=True)
class Operand:
    """A feature map's part in the model: its shape as read or written, element bits, format and memory."""

    shape: tuple[int, int, int]
    bits: int
    brick: bool
    memory: MemoryPort

    @classmethod
    def of(cls, fm: FeatureMap, shape: tuple[int, int, int], system: MemorySystem) -> "Operand":
        return cls(shape, fm.bits, fm.brick, system.memory(fm.region))

    def stored_elements(self, shape=None) -> int:
        """Elements of ``shape`` (default: the whole map) as stored: NHCWB16 rounds the depth up to 16."""
        h, w, c = shape or self.shape
        return h * w * (round_up(c, 16) if self.brick else c)

    def effective_bytes(self, elements: int, block: tuple[int, int, int], write: bool, cores: int) -> int:
        """Bytes ``elements`` cost on the bus: their bytes scaled by the memory's burst over the burst a ``block``
        makes (Vela's burst efficiency)."""
        b, (_, bw, bc) = self.bits, block
        if self.brick:
            burst_bits = 16 * b * bw * (cores if write else 1)
            if self.shape[1] * b * 16 // 8 == bc:
                burst_bits = b * bw * bc
        else:
            x_stride = self.shape[2] * b // 8
            if not write:
                burst_bits = b * bw * bc if x_stride == bc else b * bc
            else:
                burst_bits = b * bw * bc if bc <= 16 and x_stride == bc else min(512, 16 * b * cores, bc * b)
        burst = max(1, min(self.memory.burst, burst_bits // 8))
        return elements * b // 8 * self.memory.burst // burst

    def block_cycles(self, block: tuple[int, int, int], write: bool, cores: int) -> int:
        """Cycles to read (or write) one block of this map: latency plus its bytes at the memory's bandwidth."""
        clipped = tuple(min(s, k) for s, k in zip(self.shape, block))
        latency = self.memory.write_latency if write else self.memory.read_latency
        return latency + int(self.effective_bytes(volume(clipped), block, write, cores) / self.memory.bandwidth)


class Traffic:
    """Bytes an operation moves, per memory and channel; their access cycles."""

    def __init__(self, hw: Accelerator):
        self.hw = hw
        self.bytes: dict[tuple[str, str], int] = {}
        self.memories: dict[str, MemoryPort] = {}

    def add(self, memory: MemoryPort, channel: str, nbytes: int) -> None:
        self.memories[memory.name] = memory
        self.bytes[memory.name, channel] = self.bytes.get((memory.name, channel), 0) + int(nbytes)

    def merge(self, other: "Traffic | None") -> None:
        """Add ``other``'s bytes (an operation chained into this one moves its bytes in the same time)."""
        if other is not None:
            self.memories.update(other.memories)
            for key, n in other.bytes.items():
                self.bytes[key] = self.bytes.get(key, 0) + n

    def cycles(self) -> dict[str, int]:
        """Access cycles per memory: all its bytes at its bandwidth; on Ethos-U85 at least each channel's bytes at
        what that channel's read buffers and outstanding transactions let through."""
        out = {}
        for name, memory in self.memories.items():
            mine = {ch: n for (m, ch), n in self.bytes.items() if m == name}
            total = int(sum(mine.values()) / memory.bandwidth)
            if self.hw.u85:
                total = max(total, *(int(n / channel_bandwidth(self.hw, memory, ch)) for ch, n in mine.items()))
            out[name] = total
        return out


def channel_bandwidth(hw: Accelerator, memory: MemoryPort, channel: str) -> float:
    """Bytes per cycle one Ethos-U85 memory channel sustains: its read buffer's bursts (or, writing, the outstanding
    writes) over the memory's latency, within the memory's bandwidth."""
    words = max(memory.burst // 16, 1)
    if channel == "write":
        limit, outstanding, latency = math.inf, memory.max_writes, memory.write_latency
    else:
        limit = hw.read_buffers[CHANNELS.index(channel)] / words
        outstanding, latency = memory.max_reads, memory.read_latency
    use = min(limit, outstanding * memory.ports * 0.8)
    return memory.bandwidth if latency == 0 else min(memory.bandwidth, memory.burst * use / latency * 0.8)


def transfer_cycles(hw: Accelerator, src: MemoryPort, dst: MemoryPort | None, nbytes: int) -> int:
    """A DMA copy of ``nbytes``: the slower of reading them (plus latency) and writing them (plus latency); into
    internal memory (a LUT, ``dst`` None) at a byte a cycle."""
    read_bw = channel_bandwidth(hw, src, "mem2mem") if hw.u85 else src.bandwidth
    read = int(nbytes / read_bw) + src.read_latency
    if dst is None:
        return max(read, nbytes)
    write_bw = channel_bandwidth(hw, dst, "write") if hw.u85 else dst.bandwidth
    return max(read, int(nbytes / write_bw) + dst.write_latency)


def output_cycles(hw: Accelerator, kind: str, mode: str, ifm_bits: int, ofm_bits: int, binary: bool,
                  acc_wide: bool, activation: str, chained: bool, transposed: bool) -> float:
    """Cycles per OFM element of the output stage (Vela's tables, ``hardware``)."""
    if hw.u85:
        if mode == "DIV":
            return U85_DIV_CYCLES
        if chained and 32 in (ifm_bits, ofm_bits):
            index = 4
        elif ofm_bits == 64:
            index = 3
        elif kind == "NPU_OP_ELEMENTWISE" and binary and ifm_bits == 32:
            index = 5 if ofm_bits == 32 else 4
        else:
            index = {32: 2, 16: 1}.get(ofm_bits, 0)
        return max(hw.output_cycles[index], hw.activation_cycles[1 if transposed else 0])
    elementwise = kind == "NPU_OP_ELEMENTWISE"
    if elementwise and ifm_bits == 32:
        index = 1 if binary else 0
    elif mode == "MUL" and ofm_bits == 32:
        index = 2
    elif mode == "MUL" or (not elementwise and acc_wide):
        index = 3
    elif mode in ("ADD", "SUB"):
        index = 5
    elif mode == "MAX" and not elementwise:
        index = 6
    else:
        index = 7
    lut = activation.endswith(("TANH", "SIGMOID")) or "TABLE" in activation
    act = 0 if lut else (1 if activation.endswith("RELU") else 2)
    return max(hw.output_cycles[index], hw.activation_cycles[act])
