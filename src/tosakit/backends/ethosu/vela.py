"""Compile TOSA for Arm Ethos-U with Vela's C++ core (``ethosu.regor``), in process.

``compile_tosa`` takes the Vela options of an ``EthosUCompileSpec`` (``vela_options``),
hands the TOSA bytes to ``regor.compile`` and
returns what the delegate payload needs (command stream, weights, scratch
sizes, I/O placement) with Vela's performance estimate.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from ethosu import regor
from tosa.Op import Op
from tosa.TosaGraph import TosaGraph

from ...errors import TosakitError
from ...native import captured_output
from ...specs import EthosUCompileSpec
from .vela_options import (VelaConfig, VelaOptions, arena_size_limit, options_text, parse_vela_flags, regor_arch,
                           system_text, vela_options)

VELA_SHAPE_DIMS = 6


@dataclass(frozen=True)
class VelaTensor:
    """A delegate input or output as the command stream expects it."""

    shape: tuple[int, ...]  # 6 dims, left-padded with 1s
    elem_size: int  # bytes per element
    offset: int  # byte offset inside its region
    region: int  # base-address index: 0 weights, 1 scratch, 2 fast scratch


@dataclass(frozen=True)
class VelaOpPerf:
    """Vela's estimate for one operator (a row of ``vela --verbose-performance``)."""

    name: str  # output tensor name
    operator: str  # Vela's "Original Operator" (its name for the source op)
    tosa_op: str | None  # the TOSA operator it came from, when known
    npu_operator: str  # Vela's "NNG Operator"
    on_npu: bool
    cycles: int
    npu_cycles: int
    macs: int
    staging_bytes: int
    mac_utilisation: float  # macs / (cycles * MACs per cycle), 0.0 when it takes no cycles
    bound_by: str = "NPU"  # what sets its cycles: "NPU" (compute) or the memory whose accesses take longest


@dataclass
class VelaReport:
    """The figures of Vela's network summary, and per-operator estimates."""

    target: str
    system_config: str
    memory_mode: str
    clock_hz: float
    sram_used_bytes: int  # peak SRAM: Vela's "Total SRAM used"
    offchip_used_bytes: int  # Vela's "Total Off-chip Flash used" plus "Total DRAM used"
    npu_cycles: int
    total_cycles: int
    mac_count: int
    npu_ops: int
    cpu_ops: int
    inference_time_s: float  # total cycles at the NPU clock
    weights_original_bytes: int
    weights_encoded_bytes: int
    memory_used: dict[str, int]  # every "Total <memory> used" Vela prints, by its label
    access_cycles: dict[str, int]  # "<memory> Access cycles", by the same labels
    macs_per_cycle: int = 0  # the NPU's MACs per cycle, all cores
    per_op: list[VelaOpPerf] = field(default_factory=list)

    @property
    def mac_utilisation(self) -> float:
        """MACs / (cycles x MACs per cycle): how much of the NPU's peak the network uses."""
        peak = self.total_cycles * self.macs_per_cycle
        return self.mac_count / peak if peak else 0.0

    @property
    def ideal_cycles(self) -> int:
        """Cycles at full MAC use: the floor the compiler's cycle count is measured against."""
        return -(-self.mac_count // self.macs_per_cycle) if self.macs_per_cycle else 0

    @property
    def bound_by(self) -> dict[str, float]:
        """The share of the cycles spent in operators bound by NPU compute and by each memory."""
        shares: dict[str, float] = {}
        for o in self.per_op:
            shares[o.bound_by] = shares.get(o.bound_by, 0) + o.cycles
        total = sum(shares.values())
        return {k: v / total for k, v in sorted(shares.items(), key=lambda kv: -kv[1])} if total else {}

    def summary(self) -> str:
        """A few lines in the spirit of Vela's network summary."""
        lines = [f"Vela estimate for {self.target} ({self.system_config}, {self.memory_mode}, "
                 f"{self.clock_hz / 1e6:g} MHz)"]
        lines += [f"  {label} used: {used / 1024:.2f} KiB" for label, used in self.memory_used.items()]
        lines.append(f"  NPU operators: {self.npu_ops}, CPU operators: {self.cpu_ops}")
        lines.append(f"  MACs: {self.mac_count}, cycles: {self.total_cycles} (NPU {self.npu_cycles})")
        lines.append(f"  inference time: {self.inference_time_s * 1e3:.3f} ms; MAC utilisation "
                     f"{100 * self.mac_utilisation:.1f}% (ideal {self.ideal_cycles} cycles)")
        if self.bound_by:
            lines.append("  cycles bound by: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in self.bound_by.items()))
        if self.memory_hint:
            lines.append(f"  hint: {self.memory_hint}")
        return "\n".join(lines)

    @property
    def memory_hint(self) -> str | None:
        """What to try when a third or more of the cycles wait on flash or DRAM rather than compute."""
        slow = {k: v for k, v in self.bound_by.items() if k in ("Off-chip Flash", "DRAM") and v >= 1 / 3}
        if not slow:
            return None
        memory, share = next(iter(slow.items()))
        waiting = f"{100 * share:.0f}% of the cycles wait on {memory} (weights streaming in)"
        weights = f"{self.weights_encoded_bytes / 1024:.0f} KiB of encoded weights"
        if self.memory_mode.startswith("Dedicated_Sram"):  # already cached: each weight is read once anyway
            return f"{waiting}: the {weights} are read once per inference; only fewer weight bytes go faster"
        return (f"{waiting}: memory mode Sram_Only keeps the {weights} in SRAM if the system has room; on U65/U85, "
                "Dedicated_Sram caches them")


@dataclass
class VelaResult:
    """What Vela produced for one delegate."""

    cmd_data: bytes
    weight_data: bytes
    scratch_size: int
    fast_scratch_size: int
    inputs: list[VelaTensor]
    outputs: list[VelaTensor]
    report: VelaReport


# -------------------------------------------------------------- regor call

def _tosa_blocks(tosa: bytes) -> list[list[str]]:
    """The operator names of each basic block of a TOSA flatbuffer, in order."""
    names = {value: name for name, value in vars(Op).items() if not name.startswith("_")}
    graph = TosaGraph.GetRootAs(tosa, 0)
    blocks = []
    for r in range(graph.RegionsLength()):
        region = graph.Regions(r)
        for b in range(region.BlocksLength()):
            block = region.Blocks(b)
            blocks.append([names.get(block.Operators(i).Op(), "UNKNOWN") for i in range(block.OperatorsLength())])
    return blocks


def _tosa_candidates(regor_op: str, tosa: bytes) -> list[str]:
    """TOSA operators in the graph that regor's operator name can stand for ("And" -> BITWISE_AND)."""
    key = regor_op.lower().replace("_", "")
    present = dict.fromkeys(op for block in _tosa_blocks(tosa) for op in block)
    return [op for op in present if key in op.lower().replace("_", "")]


class VelaRefusal(TosakitError):
    """Vela refused a graph; ``tosa_ops`` are the TOSA operator types it named (may be empty)."""

    def __init__(self, message: str, hint: str, tosa_ops: list[str], detail: str):
        super().__init__(message, hint)
        self.tosa_ops = tosa_ops
        self.detail = detail


def _refused_ops(message: str, tosa: bytes) -> tuple[list[str], str]:
    """The TOSA operator types Vela's message names, and a text naming them."""
    regor_ops = re.findall(r"operation \((\w+)\)", message) + re.findall(r"^(\w+):$", message, re.M)
    ops, named = [], []
    for regor_op in dict.fromkeys(regor_ops):
        candidates = _tosa_candidates(regor_op, tosa)
        ops += candidates
        named.append(" or ".join(candidates) + f" (Vela: {regor_op})" if candidates else regor_op)
    return ops, ", ".join(named)


def _compile_error(message: str, tosa: bytes, opts: VelaOptions, printed: str) -> VelaRefusal:
    details = "\n".join(part.strip() for part in (message, printed) if part.strip())
    ops, refused = _refused_ops(message, tosa)
    if not refused:
        return VelaRefusal(f"Vela failed to compile the TOSA graph for {opts.accelerator}:\n{details}",
                           "check that the graph is valid TOSA 1.0 (run it with tosa_reference_model)", ops, details)
    return VelaRefusal(
        f"Vela cannot compile TOSA operator {refused} for {opts.accelerator}:\n{details}",
        "keep this operator (or its data type) out of the Ethos-U partition so it runs on the CPU, "
        "or choose a target that supports it (Ethos-U85 runs more TOSA than U55/U65)",
        ops, details,
    )


def _run_regor(tosa: bytes, opts: VelaOptions, config: VelaConfig, listing: list[str] | None = None):
    """regor's compiled model; what it printed is echoed for the verbose flags, or appended to ``listing``."""
    name, _, _ = regor_arch(opts.npu)
    system, options = system_text(opts, config), options_text(opts, config)
    with captured_output() as printed:
        try:
            model = regor.compile(name, tosa, "TOSA", system, options=options, verbose=bool(opts.verbose))
            error = None
        except RuntimeError as exc:
            model, error = None, str(exc)
    if listing is not None:
        listing.append(printed[0])
    elif opts.verbose:
        sys.stdout.write(printed[0])
    if error is not None:
        raise _compile_error(error, tosa, opts, printed[0])
    return model


# ------------------------------------------------------------------ results

_MEMORY_LABELS = {"sram": "SRAM", "dram": "DRAM", "onchipflash": "On-chip Flash", "offchipflash": "Off-chip Flash"}


def _memory_figures(perf, config: VelaConfig) -> tuple[dict[str, int], dict[str, int]]:
    """Peak usage and access cycles per memory, with Vela's split of shared SRAM."""
    used, cycles = {}, {}
    for name, memory in perf.memories.items():
        label = _MEMORY_LABELS.get(str(name).lower())
        if label is not None:
            used[label], cycles[label] = int(memory.peakUsage), int(memory.totalAccessCycles)
    read_only = int(perf.readOnlyPeakUsage)
    if read_only > 0 and "On-chip Flash" not in used and config.read_only_shares_sram():
        used["On-chip Flash"] = read_only
        used["SRAM"] = used.get("SRAM", 0) - read_only
    return {k: v for k, v in used.items() if v > 0}, cycles


def _table(database, name: str) -> list[dict[str, str]]:
    if name not in database.tables:
        return []
    table = database.tables[name]
    return [dict(zip(table.header, row)) for row in table.data]


def _per_op(model, tosa: bytes, macs_per_cycle: int) -> list[VelaOpPerf]:
    """Per-operator rows of regor's optimisation database (what ``--verbose-performance`` prints)."""
    sources = {row["id"]: row for row in _table(model.opt_database, "source")}
    blocks = _tosa_blocks(tosa)
    # regor's ext_key is the operator's index in the TOSA block; unambiguous with a single block.
    tosa_ops = blocks[0] if len(blocks) == 1 else []
    ops = []
    for row in _table(model.opt_database, "perf"):
        source = sources.get(row.get("source_id"), {})
        index = int(source.get("ext_key") or -1)
        cycles, macs = int(row.get("op_cycles") or 0), int(row.get("mac_count") or 0)
        ops.append(VelaOpPerf(
            name=row.get("name", ""),
            operator=source.get("operator", "N/A"),
            tosa_op=tosa_ops[index] if 0 <= index < len(tosa_ops) else None,
            npu_operator=row.get("operator", ""),
            on_npu=row.get("operator") != "Passthrough",
            cycles=cycles,
            npu_cycles=int(row.get("npu_cycles") or 0),
            macs=macs,
            staging_bytes=int(row.get("staging_usage") or 0),
            mac_utilisation=macs / (cycles * macs_per_cycle) if cycles else 0.0,
            bound_by=_bound_by(row, cycles),
        ))
    return ops


def _bound_by(row: dict[str, str], cycles: int) -> str:
    """"NPU" when compute sets an operator's cycles, else the memory (``<Memory>_ac`` columns) that does."""
    npu = int(row.get("npu_cycles") or 0)
    access = {_MEMORY_LABELS[k[:-3].lower()]: int(v or 0) for k, v in row.items()
              if k.endswith("_ac") and k[:-3].lower() in _MEMORY_LABELS}
    memory = max(access, key=access.get, default=None)
    return memory if memory is not None and npu < cycles and access[memory] > npu else "NPU"


def _report(model, tosa: bytes, opts: VelaOptions, config: VelaConfig) -> VelaReport:
    perf = model.perf_report
    _, macs, cores = regor_arch(opts.npu)
    used, cycles = _memory_figures(perf, config)
    return VelaReport(
        target=opts.accelerator,
        system_config=opts.system_config,
        memory_mode=opts.memory_mode,
        clock_hz=config.clock_hz,
        sram_used_bytes=used.get("SRAM", 0),
        offchip_used_bytes=used.get("Off-chip Flash", 0) + used.get("DRAM", 0),
        npu_cycles=int(perf.npuCycles),
        total_cycles=int(perf.totalCycles),
        mac_count=int(perf.macCount),
        npu_ops=int(perf.npuOps),
        cpu_ops=int(perf.cpuOps),
        inference_time_s=int(perf.totalCycles) / config.clock_hz,
        weights_original_bytes=int(perf.originalWeights),
        weights_encoded_bytes=int(perf.encodedWeights),
        memory_used=used,
        access_cycles=cycles,
        macs_per_cycle=macs * cores,
        per_op=_per_op(model, tosa, macs * cores),
    )


def _tensor(t) -> VelaTensor:
    shape = tuple(int(d) for d in t.shape)
    return VelaTensor((1,) * (VELA_SHAPE_DIMS - len(shape)) + shape, int(t.element_size), int(t.address), int(t.region))


def _check_all_on_npu(report: VelaReport) -> None:
    if report.cpu_ops == 0:
        return
    names = [op.tosa_op or op.operator for op in report.per_op if not op.on_npu]
    raise TosakitError(
        f"Vela placed {report.cpu_ops} operator(s) on the CPU ({', '.join(names) or 'unnamed'}) "
        f"for {report.target}: an Ethos-U delegate must run entirely on the NPU",
        "keep these operators out of the Ethos-U partition so they run on the CPU",
    )


def _check_sram(report: VelaReport, opts: VelaOptions, config: VelaConfig) -> None:
    """Vela overruns a too-small arena cache silently; a program that needs more SRAM than the memory mode
    gives it cannot run, so say so."""
    limit = arena_size_limit(opts, config)
    if report.sram_used_bytes <= limit:
        return
    advice = [] if opts.optimise == "Size" else ["--optimise Size (trades cycles for SRAM)"]
    if opts.npu.family != "u55" and not opts.memory_mode.startswith("Dedicated_Sram"):
        advice.insert(0, "memory mode Dedicated_Sram (the arena in DRAM, SRAM as its cache)")
    advice.append("a larger --arena-cache-size, if the device has the SRAM")
    raise TosakitError(
        f"the program needs {report.sram_used_bytes / 1024:.1f} KiB of SRAM at its peak, more than the "
        f"{limit / 1024:.1f} KiB that {opts.memory_mode} on {opts.system_config} allows (arena cache size)",
        "try " + ", or ".join(advice))


def compile_tosa(tosa: bytes, spec: EthosUCompileSpec) -> VelaResult:
    """Compile a TOSA 1.0 flatbuffer with Vela, as ``spec``'s options say."""
    tosa = bytes(tosa)
    if len(tosa) < 8 or tosa[4:8] != b"TOSA":
        raise TosakitError("the bytes given to Vela are not a TOSA flatbuffer (no 'TOSA' identifier)",
                           "pass the output of the TOSA serializer")
    opts = vela_options(spec)
    config = VelaConfig(opts)
    model = _run_regor(tosa, opts, config)
    report = _report(model, tosa, opts, config)
    _check_all_on_npu(report)
    _check_sram(report, opts, config)
    return VelaResult(
        cmd_data=bytes(model.command_stream),
        weight_data=bytes(model.read_only.data),
        scratch_size=int(model.scratch.size),
        fast_scratch_size=int(model.scratch_fast.size),
        inputs=[_tensor(t) for t in model.inputs],
        outputs=[_tensor(t) for t in model.outputs],
        report=report,
    )


# ------------------------------------------------------------------ a compile's records, for the checkers


@dataclass(frozen=True)
class VelaRecords:
    """What Vela records of compiling a graph, for the checkers that pair its NPU operations with TOSA tensors
    (``tosakit.verify``): the command stream, the high-level listing it printed, the tables of its debug database
    and the TOSA operator names of each block of the graph."""

    cmd_data: bytes
    listing: str
    tables: dict[str, list[dict[str, str]]]  # "queue", "optimised", "source": rows by column name
    tosa_blocks: list[list[str]]


def compile_records(tosa: bytes, flags: list[str]) -> VelaRecords:
    """Vela run again on ``tosa`` with a delegate's Vela ``flags``, printing its high-level command stream."""
    opts = parse_vela_flags(list(flags) + ["--verbose-high-level-command-stream"])
    printed: list[str] = []
    model = _run_regor(bytes(tosa), opts, VelaConfig(opts), printed)
    tables = {name: _table(model.opt_database, name) for name in ("queue", "optimised", "source", "perf", "perf_debug")}
    return VelaRecords(bytes(model.command_stream), printed[0], tables, _tosa_blocks(tosa))
