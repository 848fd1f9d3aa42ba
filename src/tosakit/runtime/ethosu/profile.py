"""Where a command stream's time goes: each operation placed on a timeline (the compute engine and the DMA run
side by side, each in order, and the stream's DMA_WAIT / KERNEL_WAIT commands hold them back as they do on the
device) with its estimated cycles (``estimate``), and the performance counters ExecuTorch's Ethos-U runner reads.
Beat counts come from the bytes the simulation moved, per AXI port, so they are exact for the stream; cycles, MAC-
and weight-decoder-active cycles are the model's estimates."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .estimate import estimate
from .hardware import ACCELERATORS, Accelerator
from .system import MemorySystem, memory_system
from .timing import transfer_cycles

# The counters ExecuTorch's Ethos-U runner programs (arm_perf_monitor), per family, after the cycle counter.
PMU_EVENTS = {
    "u55": ("AXI0_RD_DATA_BEAT_RECEIVED", "AXI1_RD_DATA_BEAT_RECEIVED", "AXI0_WR_DATA_BEAT_WRITTEN",
            "AXI1_WR_DATA_BEAT_WRITTEN", "NPU_IDLE"),
    "u85": ("SRAM_RD_DATA_BEAT_RECEIVED", "SRAM_WR_DATA_BEAT_WRITTEN", "EXT_RD_DATA_BEAT_RECEIVED",
            "EXT_WR_DATA_BEAT_WRITTEN", "NPU_IDLE", "MAC_ACTIVE", "WD_ACTIVE"),
}
_UNTIMED = ("NPU_OP_DMA_WAIT", "NPU_OP_KERNEL_WAIT", "NPU_OP_STOP", "NPU_OP_IRQ", "NPU_OP_PMU_MASK")


def events(hw: Accelerator) -> tuple[str, ...]:
    """The event counters ExecuTorch's runner reads on ``hw``'s family."""
    return PMU_EVENTS["u85" if hw.u85 else "u55"]


@dataclass(frozen=True)
class NpuOp:
    """One operation of the stream: its number among the stream's operations, command offset and name (CONV,
    DMA_START, ...), estimated start and cycles (from the stream's start), compute cycles, MACs, what bounds
    it, its counters (``events``), the bytes it moved per AXI port and direction, and the bytes the model charges
    each memory (``traffic``: re-fetches and burst inefficiency included, as Vela counts them)."""

    index: int
    offset: int
    operation: str
    start: int
    cycles: int
    compute_cycles: int
    macs: int
    bound_by: str
    counters: dict[str, int]
    moved: dict[str, int]
    traffic: dict[str, int] = field(default_factory=dict)

    @property
    def end(self) -> int:
        return self.start + self.cycles


def progress(operations) -> list[tuple[NpuOp, int]]:
    """Each compute operation (DMA left out) with its share of the compute engine's progress: from the end of the
    operation that ended before it to its own end, so the shares add up to the last one's end."""
    out, before = [], 0
    for op in sorted((o for o in operations if o.operation != "DMA_START"), key=lambda o: o.end):
        out.append((op, max(0, op.end - before)))
        before = max(before, op.end)
    return out


@dataclass
class NpuProfile:
    """A stream's operations on the timeline, on ``accelerator`` in ``system``."""

    accelerator: str
    system: MemorySystem
    operations: list[NpuOp] = field(default_factory=list)

    @property
    def total_cycles(self) -> int:
        """The NPU's cycle counter for the stream: from its start to the end of its last operation."""
        return max((op.end for op in self.operations), default=0)

    def counters(self) -> dict[str, int]:
        """The stream's counters: the cycle counter (NPU_ACTIVE), then each event's total; NPU_IDLE the cycles
        in which neither the compute engine nor the DMA works."""
        hw = ACCELERATORS[self.accelerator]
        out = {"NPU_ACTIVE": self.total_cycles}
        for name in events(hw):
            out[name] = sum(op.counters.get(name, 0) for op in self.operations)
        busy, covered = 0, 0
        for op in sorted(self.operations, key=lambda o: o.start):
            if op.end > covered:
                busy += op.end - max(op.start, covered)
                covered = op.end
        out["NPU_IDLE"] = self.total_cycles - busy
        return out

    def to_message(self) -> dict[str, np.ndarray]:
        """The profile as arrays (how the sandbox's child hands it back)."""
        figures = [{**op.counters, **op.moved, **{f"traffic:{k}": v for k, v in op.traffic.items()}}
                   for op in self.operations]
        names = sorted({k for f in figures for k in f})
        rows = [[op.index, op.offset, op.start, op.cycles, op.compute_cycles, op.macs] + [f.get(n, -1) for n in names]
                for op, f in zip(self.operations, figures)]  # -1: absent
        return {"profile_rows": np.array(rows, np.int64).reshape(len(rows), 6 + len(names)),
                "profile_names": np.array(names or [""]), "profile_ops": np.array(
                    [f"{op.operation}|{op.bound_by}" for op in self.operations] or [""]),
                "profile_system": np.array([self.accelerator, self.system.system_config, self.system.memory_mode])}

    @classmethod
    def from_message(cls, message: dict[str, np.ndarray], flags: list[str]) -> "NpuProfile":
        accelerator = str(message["profile_system"][0])
        profile = cls(accelerator, memory_system(flags, ACCELERATORS[accelerator]))
        names = [str(n) for n in message["profile_names"]]
        for row, kind in zip(message["profile_rows"].tolist(), message["profile_ops"]):
            operation, bound = str(kind).split("|")
            values = {n: v for n, v in zip(names, row[6:]) if v >= 0}
            counters = {n: v for n, v in values.items() if n in PMU_EVENTS["u55"] + PMU_EVENTS["u85"]}
            traffic = {n.removeprefix("traffic:"): v for n, v in values.items() if n.startswith("traffic:")}
            moved = {n: v for n, v in values.items() if n not in counters and not n.startswith("traffic:")}
            profile.operations.append(NpuOp(row[0], row[1], operation, row[2], row[3], row[4], row[5], bound,
                                            counters, moved, traffic))
        return profile


class Profiler:
    """Observes a simulation (``Npu.run``'s ``observe``) and places each operation on the timeline."""

    def __init__(self, accelerator: str, system: MemorySystem):
        self.hw = ACCELERATORS[accelerator]
        self.profile = NpuProfile(accelerator, system)
        self.issue = 0  # when the command processor reaches the next command
        self.kernels: list[int] = []  # end of each compute operation, in order
        self.dmas: list[int] = []  # end of each DMA, in order
        self.chain: _Chain | None = None  # the operation whose OFM the next one reads from a chain buffer

    def __call__(self, npu, command) -> None:
        name = command.register.name
        if name == "NPU_OP_DMA_WAIT":  # until at most k DMAs are outstanding
            self.issue = max(self.issue, _outstanding_until(self.dmas, command.field("k")))
        elif name == "NPU_OP_KERNEL_WAIT":  # until at most n operations are outstanding
            self.issue = max(self.issue, _outstanding_until(self.kernels, command.field("n")))
        if name in _UNTIMED:
            return
        moved = self._moved(npu)
        if name == "NPU_OP_DMA_START":
            cycles, traffic = self._dma(npu, moved)
            start = max(self.issue, self.dmas[-1] if self.dmas else 0)
            self.dmas.append(start + cycles)
            self._record(command, name, start, cycles, 0, 0, "DMA", moved, {}, traffic)
            return
        cost = estimate(npu, command, self.hw, self.profile.system)
        if self.chain is not None and _reads_chain(npu):  # its time is its producer's: zero of its own
            self._join_chain(npu, cost)
            self._record(command, name, self.chain.start, 0, 0, cost.macs, "chained", moved, {}, {})
            if not npu.ofm_chained():
                self.chain = None
            return
        start = max(self.issue, self.kernels[-1] if self.kernels else 0)
        self.kernels.append(start + cost.cycles)
        self._record(command, name, start, cost.cycles, cost.compute, cost.macs, cost.bound_by, moved,
                     self._model_counters(cost), _per_memory(cost.traffic))
        self.chain = _Chain(len(self.profile.operations) - 1, start, command, dict(npu.regs.commands)) \
            if npu.ofm_chained() else None

    def _join_chain(self, npu, cost) -> None:
        """An operation reading the chain buffer runs in its producer's pipeline: the producer estimated again
        with this one's output stage added to its own, and this one's bytes moved in the same time."""
        chain = self.chain
        chain.ao += cost.ao
        chain.traffic.append(cost.traffic)
        saved, npu.regs.commands = npu.regs.commands, chain.registers
        try:
            group = estimate(npu, chain.command, self.hw, self.profile.system, chain.ao)
        finally:
            npu.regs.commands = saved
        for traffic in chain.traffic:
            group.traffic.merge(traffic)
        first = self.profile.operations[chain.index]
        self.profile.operations[chain.index] = replace(
            first, cycles=group.cycles, compute_cycles=group.compute, bound_by=group.bound_by,
            counters={**first.counters, **self._model_counters(group)}, traffic=_per_memory(group.traffic))
        self.kernels[-1] = max(self.kernels[-1], chain.start + group.cycles)

    def _model_counters(self, cost) -> dict[str, int]:
        return {"MAC_ACTIVE": cost.mac, "WD_ACTIVE": cost.weight_decode} if self.hw.u85 else {}

    def _record(self, command, name, start, cycles, compute, macs, bound, moved, extra, traffic) -> None:
        self.profile.operations.append(NpuOp(len(self.profile.operations), command.offset,
                                             name.removeprefix("NPU_OP_"), start, cycles, compute, macs, bound,
                                             {**self._beats(moved), **extra}, moved, traffic))

    def _moved(self, npu) -> dict[str, int]:
        """The bytes the operation moved, per AXI port and direction ("AXI0 read", ...)."""
        out: dict[str, int] = {}
        for (region, way), nbytes in npu.moved.items():
            key = f"AXI{self.profile.system.memory(region).axi} {way}"
            out[key] = out.get(key, 0) + nbytes
        return out

    def _beats(self, moved: dict[str, int]) -> dict[str, int]:
        beat = self.hw.axi_bytes
        names = {"AXI0 read": 0, "AXI1 read": 1, "AXI0 write": 2, "AXI1 write": 3} if not self.hw.u85 else \
            {"AXI0 read": 0, "AXI0 write": 1, "AXI1 read": 2, "AXI1 write": 3}
        return {events(self.hw)[i]: -(-moved.get(key, 0) // beat) for key, i in names.items()}

    def _dma(self, npu, moved: dict[str, int]) -> tuple[int, dict[str, int]]:
        """A DMA's cycles, and its bytes per memory: read from its source, written to its destination (none into
        internal memory)."""
        system = self.profile.system
        src = system.memory(npu.value("DMA0_SRC_REGION", "region"))
        internal = npu.name("DMA0_DST_REGION", "region_mode").endswith("INTERNAL")
        dst = None if internal else system.memory(npu.value("DMA0_DST_REGION", "region"))
        nbytes = sum(v for k, v in moved.items() if k.endswith("read"))
        traffic = {src.name: nbytes}
        if dst is not None:
            traffic[dst.name] = traffic.get(dst.name, 0) + nbytes
        return transfer_cycles(self.hw, src, dst, nbytes), traffic


@dataclass
class _Chain:
    """An Ethos-U85 operation that left its OFM in a chain buffer: its place in the profile, start, command and
    registers, and what the operations chained after it add (output cycles per element, bytes moved)."""

    index: int
    start: int
    command: object
    registers: dict
    ao: float = 0.0
    traffic: list = field(default_factory=list)


def _per_memory(traffic) -> dict[str, int]:
    """A ``timing.Traffic``'s bytes summed per memory."""
    out: dict[str, int] = {}
    for (memory, _), nbytes in (traffic.bytes.items() if traffic is not None else ()):
        out[memory] = out.get(memory, 0) + nbytes
    return out


def _reads_chain(npu) -> bool:
    """Whether the operation reads an IFM from a chain buffer (Ethos-U85)."""
    return npu.u85 and any(npu.name(f"{fm}_PRECISION", "activation_storage").endswith("CHAINED")
                           for fm in ("IFM", "IFM2"))


def _outstanding_until(ends: list[int], allowed: int) -> int:
    """When at most ``allowed`` of the work items ending at ``ends`` (in order) remain unfinished."""
    return ends[-allowed - 1] if len(ends) > allowed else 0
