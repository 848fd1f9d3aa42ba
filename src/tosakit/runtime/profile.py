"""Where a program's time goes on the device, estimated: its CPU kernels at the Cortex-M cost rules'
cycles (``cpu_cycles``), each Ethos-U delegate call as the NPU operations of its command stream with the
performance model's cycles and counters (``ethosu.profile``), placed one after the other on one timeline in
device time. Printed as a table (``lines``), written as a Chrome/Perfetto trace (``chrome_trace``). Every cycle
figure is an estimate; byte and beat counts are what the simulation moved."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..program import schema as S
from .cpu_cycles import core_for, cpu_cycles
from .ethosu.profile import NpuProfile
from .records import Step

UNITS = ("CPU", "NPU", "DMA")  # the timeline's rows (trace threads)


@dataclass(frozen=True)
class Event:
    """One piece of work on the timeline: where it runs, what it is, its instruction, its estimated start and
    duration (µs of device time) and cycles (None: no estimate, its host time stands in), its host time (µs), and
    figures for the trace's ``args`` (counters, MACs, what bounds it)."""

    unit: str
    name: str
    instruction: int
    start_us: float
    duration_us: float
    cycles: int | None
    host_us: float
    args: dict = field(default_factory=dict)


@dataclass
class ProgramProfile:
    """One profiled run of a method: its events in order, and each delegate call's NPU profile."""

    method: str
    core: str
    cpu_clock_hz: float
    events: list[Event]
    npu: list[tuple[int, NpuProfile]]  # (instruction, profile) per simulated delegate call

    @property
    def total_us(self) -> float:
        return max((e.start_us + e.duration_us for e in self.events), default=0.0)

    def unit_us(self, unit: str) -> float:
        """Time on the timeline the ``unit`` is busy: for the NPU and its DMA together, the delegate calls'."""
        if unit == "CPU":
            return sum(e.duration_us for e in self.events if e.unit == "CPU")
        return sum(1e6 * p.total_cycles / p.system.clock_hz for _, p in self.npu)

    def counters(self) -> dict[str, int]:
        """The NPU's counters over the run, summed over its delegate calls."""
        out: dict[str, int] = {}
        for _, p in self.npu:
            for k, v in p.counters().items():
                out[k] = out.get(k, 0) + v
        return out

    def lines(self, top: int = 10, rows: int = 60) -> list[str]:
        """The timeline table (its first ``rows`` events), the ``top`` consumers, and the totals."""
        out = [f"Profile of {self.method} (estimated device time; CPU kernels on {self.core} at "
               f"{self.cpu_clock_hz / 1e6:.0f} MHz{self._npu_clock()}):",
               f"  {'start us':>10} {'time us':>9}  {'unit':4} {'instr':>5}  {'what':<40} {'cycles':>12}  bound by"]
        for e in self.events[:rows]:
            cycles = f"{e.cycles:,}" if e.cycles is not None else "host time"
            out.append(f"  {e.start_us:>10.1f} {e.duration_us:>9.1f}  {e.unit:4} {e.instruction:>5}  {e.name[:40]:<40} "
                       f"{cycles:>12}  {e.args.get('bound_by', '')}".rstrip())
        if len(self.events) > rows:
            out.append(f"  ... {len(self.events) - rows} more event(s) (all of them: --trace FILE)")
        total = self.total_us or 1.0
        out.append(f"Top {top} by estimated time:")
        for e in sorted(self.events, key=lambda e: -e.duration_us)[:top]:
            out.append(f"  {e.duration_us:>9.1f} us {100 * e.duration_us / total:>5.1f}%  {e.unit:4} instruction "
                       f"{e.instruction}: {e.name}")
        cpu, npu = self.unit_us("CPU"), self.unit_us("NPU")
        out.append(f"Total: {self.total_us:.1f} us estimated: CPU {cpu:.1f} us ({100 * cpu / total:.0f}%), "
                   f"NPU {npu:.1f} us ({100 * npu / total:.0f}%)")
        unestimated = [e for e in self.events if e.cycles is None]
        if unestimated:
            host = sum(e.duration_us for e in unestimated)
            hint = ": a delegate is timed on the device only when the Ethos-U simulator runs it (--engine npu)" \
                if any(e.unit == "NPU" for e in unestimated) else ""
            out.append(f"  of which {host:.1f} us is the host's time for {len(unestimated)} call(s) with no estimate "
                       f"({', '.join(dict.fromkeys(e.name for e in unestimated))}){hint}")
        counters = self.counters()
        if counters:
            out.append("NPU counters (beats: moved by the simulation; cycles: estimates): "
                       + ", ".join(f"{k} {v:,}" for k, v in counters.items()))
        return out

    def _npu_clock(self) -> str:
        clocks = sorted({p.system.clock_hz for _, p in self.npu})
        systems = sorted({f"{p.accelerator}, {p.system.system_config}/{p.system.memory_mode}" for _, p in self.npu})
        if not clocks:
            return ""
        return f"; NPU {'; '.join(systems)} at {', '.join(f'{c / 1e6:.0f}' for c in clocks)} MHz"

    def chrome_trace(self) -> str:
        """The timeline as a Chrome/Perfetto trace (JSON): each event complete ("X") on its unit's thread, its
        estimated cycles in ``args.cycles`` and its counters beside them."""
        threads = {unit: k + 1 for k, unit in enumerate(UNITS)}
        trace = [{"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": unit}}
                 for unit, tid in threads.items()]
        trace.append({"name": "process_name", "ph": "M", "pid": 1, "args": {"name": f"{self.method} (estimated)"}})
        for e in self.events:
            args = {"instruction": e.instruction, "cycles": e.cycles, "host_us": round(e.host_us, 3), **e.args}
            trace.append({"name": e.name, "cat": e.unit, "ph": "X", "pid": 1, "tid": threads[e.unit],
                          "ts": round(e.start_us, 3), "dur": round(e.duration_us, 3), "args": args})
        return json.dumps({"traceEvents": trace, "displayTimeUnit": "ns",
                           "otherData": {"estimated": True, "method": self.method}}, indent=None)


def program_profile(plan: S.ExecutionPlan, steps: list[Step], core: str | None = None,
                    labels: dict[int, dict[int, str]] | None = None) -> ProgramProfile:
    """The timeline of a profiled run's ``steps`` of ``plan``: CPU kernels on ``core`` (by default the Cortex-M55
    beside an Ethos-U), delegate calls as their NPU operations (or, run another way, their host time); ``labels``:
    per delegate index, what each NPU operation computes, by its command offset (an operation map)."""
    cpu = cpu_cycles(plan, core_for(core or ""))
    estimates = {c.index: c.estimate for c in cpu.calls}
    clock = cpu.board.clock_hz
    events, npu, now = [], [], 0.0
    for step in steps:
        host = step.host_ns / 1e3
        if step.delegate is None:
            estimate = estimates.get(step.instruction)
            cycles = estimate.cycles if estimate is not None else None
            duration = 1e6 * cycles / clock if cycles is not None else host
            events.append(Event("CPU", step.name, step.instruction, now, duration, cycles, host))
            now += duration
            continue
        profile = step.npu
        if not isinstance(profile, NpuProfile):
            events.append(Event("NPU", f"{step.name} (run on {step.engine})", step.instruction, now, host, None,
                                host))
            now += host
            continue
        npu.append((step.instruction, profile))
        scale = 1e6 / profile.system.clock_hz
        named = (labels or {}).get(step.delegate, {})
        for op in profile.operations:
            unit = "DMA" if op.operation == "DMA_START" else "NPU"
            args = {"offset": f"{op.offset:#x}", "macs": op.macs, "compute_cycles": op.compute_cycles,
                    "bound_by": op.bound_by, **op.counters, **{f"bytes {k}": v for k, v in op.moved.items()}}
            label = f"{op.operation} #{op.index}" + (f" {named[op.offset]}" if op.offset in named else "")
            events.append(Event(unit, label, step.instruction, now + op.start * scale, op.cycles * scale, op.cycles,
                                0.0, args))
        now += profile.total_cycles * scale
    return ProgramProfile(plan.name, cpu.core, clock, events, npu)
