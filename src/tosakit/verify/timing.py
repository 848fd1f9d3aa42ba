"""The simulator's performance model against Vela's own estimate, per delegate and per Vela operation: the
stream simulated with timing on, Vela run again on the delegate's TOSA for its records (which command-stream
offsets run which of its operations, and its per-operation cycles), each Vela operation's share of the timeline
set beside Vela's figure for it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..backends.ethosu.payload import parse_payload
from ..backends.ethosu.vela import compile_records
from ..runtime.ethosu.profile import NpuProfile, progress
from ..runtime.ethosu.simulate import simulate
from ..runtime.ethosu.system import compile_flags


@dataclass(frozen=True)
class OpTiming:
    """One Vela operation: its name and operator, the simulator's cycles for it (the compute engine's progress
    over its commands, waits included) and Vela's (``op_cycles``), and what bounds it on each side."""

    name: str
    operator: str
    simulated: int
    vela: int
    simulated_bound: str
    vela_bound: str

    @property
    def ratio(self) -> float:
        return self.simulated / self.vela if self.vela else float("inf")


@dataclass
class TimingCheck:
    """A delegate's whole-stream cycles, simulated and Vela's, and per operation (empty, with ``why``, when Vela's
    records do not describe the payload's stream)."""

    accelerator: str
    system: str
    simulated: int
    vela: int
    profile: NpuProfile
    operations: list[OpTiming] = field(default_factory=list)
    why: str | None = None
    vela_traffic: dict[str, int] = field(default_factory=dict)  # bytes Vela charges each memory (its debug database)

    @property
    def model_traffic(self) -> dict[str, int]:
        """Bytes the performance model charges each memory, over the stream."""
        return _summed(op.traffic for op in self.profile.operations)

    @property
    def moved(self) -> dict[str, int]:
        """Bytes the simulation moved to and from each memory (what the beat counters count)."""
        by_port = _summed(op.moved for op in self.profile.operations)
        names = {r.axi: r.name for r in self.profile.system.regions.values()}
        return _summed({names.get(int(k[3]), k): v} for k, v in by_port.items())

    @property
    def ratio(self) -> float:
        return self.simulated / self.vela if self.vela else float("inf")

    def within(self, tolerance: float) -> list[OpTiming]:
        """The operations whose simulated cycles lie within ``tolerance`` of Vela's."""
        return [o for o in self.operations if abs(o.ratio - 1) <= tolerance]


def _bound(row: dict) -> str:
    npu = int(row.get("npu_cycles") or 0)
    access = {k[:-3]: int(v or 0) for k, v in row.items() if k.endswith("_ac") and k != "lutram_ac"}
    memory = max(access, key=access.get, default=None)
    return memory if memory is not None and access[memory] > npu else "compute"


def check_timing(module, seed: int = 0, timed_in: list[str] | None = None) -> TimingCheck:
    """An Ethos-U delegate (a ``LoweredBackendModule`` with its Vela report) simulated on seeded random inputs
    with timing on, against Vela's estimate; ``timed_in``: Vela flags naming another system config and memory mode
    to time the same stream in (by default the compile's)."""
    payload = parse_payload(module.processed_bytes)
    flags = compile_flags(module.compile_specs)
    rng = np.random.default_rng(seed)
    inputs = [rng.integers(-100, 100, size=int(np.prod(t.shape))).astype(f"<i{t.elem_size}") for t in payload.inputs]
    profile = simulate(payload, inputs, profile=flags + list(timed_in or [])).profile
    check = TimingCheck(profile.accelerator, f"{profile.system.system_config}/{profile.system.memory_mode}",
                        profile.total_cycles, module.report.total_cycles, profile)
    records = compile_records(module.tosa, flags)
    if records.cmd_data != bytes(payload.cmd_data):
        check.why = "Vela compiled the TOSA again into another command stream than the payload's"
        return check
    check.operations = _per_operation(profile, records.tables)
    check.vela_traffic = _vela_traffic(records.tables.get("perf_debug", []))
    return check


def _summed(dicts) -> dict[str, int]:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


_TRAFFIC = re.compile(r"^(\w+?)(FeatureMap|Weights|Scales)_(read|write)$")


def _vela_traffic(rows: list[dict]) -> dict[str, int]:
    """Bytes Vela's debug database charges each memory (feature maps, weights, scales; not the LUT), over the
    operations."""
    out: dict[str, int] = {}
    for row in rows:
        for key, value in row.items():
            m = _TRAFFIC.match(key)
            if m and value and m.group(1) not in ("lutram", "shram"):
                out[m.group(1)] = out.get(m.group(1), 0) + int(float(value))
    return out


def _per_operation(profile: NpuProfile, tables: dict) -> list[OpTiming]:
    """Vela's operations, each with the compute engine's progress over its commands (a command's share: from the
    end of the command before to its own end), summed over the stripes of a cascade; an operation Vela gives no
    cycles (a U85 operation chained into the one before) joins that one. Vela's queue places each of its
    operations at its last NPU operation command (a compound one, like an Ethos-U55 MATMUL, runs many): a
    command belongs to the first operation placed at or after it."""
    perf = {row["id"]: row for row in tables["perf"]}
    queue = sorted(tables["queue"], key=lambda r: int(r["offset"]))
    starts = [int(r["offset"]) for r in queue]
    owner, order = [], []  # per queue entry: the operation it counts for; the operations in their first order
    for r in queue:
        sid = r["scheduled_id"]
        if not int(perf.get(sid, {}).get("op_cycles") or 0) and owner:
            sid = owner[-1]
        owner.append(sid)
        if sid not in order:
            order.append(sid)
    cycles = dict.fromkeys(order, 0)
    longest: dict = {}
    for op, share in progress(profile.operations):
        sid = owner[min(len(owner) - 1, int(np.searchsorted(starts, op.offset, side="left")))]
        cycles[sid] += share
        if sid not in longest or op.cycles > longest[sid].cycles:
            longest[sid] = op
    return [OpTiming(perf.get(sid, {}).get("name", "?"), perf.get(sid, {}).get("operator", "?"), cycles[sid],
                     int(perf.get(sid, {}).get("op_cycles") or 0),
                     longest[sid].bound_by if sid in longest else "-", _bound(perf.get(sid, {}))) for sid in order]
