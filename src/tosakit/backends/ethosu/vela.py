"""Compile TOSA for Arm Ethos-U with Vela's C++ core (``ethosu.regor``), in process.

``compile_tosa`` reads the Vela flags of an ``EthosUCompileSpec`` the way the
``vela`` command line does, hands the TOSA bytes to ``regor.compile`` and
returns what the delegate payload needs (command stream, weights, scratch
sizes, I/O placement) with Vela's performance estimate.
"""

from __future__ import annotations

import configparser
import re
import sys
from dataclasses import dataclass, field
from typing import Callable

from ethosu import regor
from tosa.Op import Op
from tosa.TosaGraph import TosaGraph

from ...errors import TosakitError, did_you_mean
from ...native import captured_output
from ...specs import ETHOSU_TARGETS, EthosUCompileSpec, npu_family, resolve_vela_config

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


# ----------------------------------------------------------------------- flags


@dataclass
class VelaOptions:
    """The Vela flags tosakit understands, after parsing."""

    accelerator: str | None = None
    configs: list[str] = field(default_factory=list)
    system_config: str | None = None
    memory_mode: str | None = None
    optimise: str = "Performance"
    arena_cache_size: int | None = None
    cpu_tensor_alignment: int = 16
    tensor_allocator: str = "HillClimb"
    cop_format: str = "COP1"
    softmax_int16_neg_exp_range: float = 10.0
    disabled_features: list[str] = field(default_factory=list)
    verbose: list[tuple[str, str]] = field(default_factory=list)  # (regor section, key)


# Verbose flags regor acts on: flag -> (options section, key). Its text is echoed to stdout.
_REGOR_VERBOSE = {
    "--verbose-graph": ("graph", "verbose"),
    "--verbose-quantization": ("graph", "verbose_quantization"),
    "--verbose-schedule": ("scheduler", "verbose"),
    "--verbose-allocation": ("scheduler", "verbose_allocation"),
    "--verbose-high-level-command-stream": ("compiler", "verbose_high_level_command_stream"),
    "--verbose-register-command-stream": ("compiler", "verbose_register_command_stream"),
}
# Flags that only change what the vela CLI prints or writes: the report already holds that data.
_ACCEPTED_NO_OP = (
    "--verbose-config", "--verbose-packing", "--verbose-tensor-purpose", "--verbose-tensor-format",
    "--verbose-operators", "--verbose-weights", "--verbose-cycle-estimate", "--verbose-performance",
    "--verbose-progress", "--show-cpu-operations", "--enable-debug-db", "--debug-force-regor", "--timing",
)
_DISABLE_FEATURES = {
    "--disable-chaining": "Grouping",
    "--disable-fwd": "FWD",
    "--disable-cascading": "Cascading",
    "--disable-buffering": "WeightBuffering",
    "--disable-ifm-reuse": "ReuseIFM",
}


def _choice(flag: str, value: str, choices) -> str:
    if value not in choices:
        raise TosakitError(f"invalid value {value!r} for Vela flag {flag}", did_you_mean(value, choices))
    return value


def _number(flag: str, value: str, kind: type, valid: Callable[[float], bool], rule: str):
    try:
        number = kind(value)
    except ValueError:
        number = None
    if number is None or not valid(number):
        raise TosakitError(f"invalid value {value!r} for Vela flag {flag}", f"it must be {rule}")
    return number


def _set(name: str, convert: Callable[[str, str], object]) -> Callable[[VelaOptions, str, str], None]:
    return lambda opts, flag, value: setattr(opts, name, convert(flag, value))


_VALUE_FLAGS: dict[str, Callable[[VelaOptions, str, str], None]] = {
    "--accelerator-config": _set("accelerator", lambda f, v: _choice(f, v.lower(), ETHOSU_TARGETS)),
    "--config": lambda opts, flag, value: opts.configs.append(value),
    "--system-config": _set("system_config", lambda f, v: v),
    "--memory-mode": _set("memory_mode", lambda f, v: v),
    "--output-format": lambda opts, flag, value: _choice(flag, value, ("raw",)),
    "--optimise": _set("optimise", lambda f, v: _choice(f, v, ("Size", "Performance"))),
    "--arena-cache-size": _set(
        "arena_cache_size", lambda f, v: _number(f, v, int, lambda n: n >= 0, "a size in bytes (>= 0)")),
    "--cpu-tensor-alignment": _set("cpu_tensor_alignment", lambda f, v: _number(
        f, v, int, lambda n: n >= 16 and n & (n - 1) == 0, "a power of 2, at least 16")),
    "--tensor-allocator": _set(
        "tensor_allocator", lambda f, v: _choice(f, v, ("LinearAlloc", "Greedy", "HillClimb"))),
    "--cop-format": _set("cop_format", lambda f, v: _choice(f, v, ("COP1", "COP2"))),
    "--experimental-softmax-int16-neg-exp-range": _set("softmax_int16_neg_exp_range", lambda f, v: _number(
        f, v, float, lambda x: 0 < x < 65535, "a number between 0 and 65535 (exclusive)")),
}


def _switch(opts: VelaOptions, flag: str) -> None:
    if flag == "--verbose-all":
        opts.verbose.extend(_REGOR_VERBOSE.values())
    elif flag in _REGOR_VERBOSE:
        opts.verbose.append(_REGOR_VERBOSE[flag])
    elif flag in _DISABLE_FEATURES:
        opts.disabled_features.append(_DISABLE_FEATURES[flag])


_SWITCH_FLAGS = ("--verbose-all", *_REGOR_VERBOSE, *_ACCEPTED_NO_OP, *_DISABLE_FEATURES)
SUPPORTED_VELA_FLAGS = tuple(sorted((*_VALUE_FLAGS, *_SWITCH_FLAGS)))


def _unsupported(token: str) -> TosakitError:
    return TosakitError(
        f"Vela flag {token!r} is not supported by tosakit",
        f"supported flags: {', '.join(SUPPORTED_VELA_FLAGS)}",
    )


def parse_vela_flags(flags: list[str]) -> VelaOptions:
    """Read Vela command-line flags (``--flag=value`` or ``--flag value``); later ones win."""
    opts = VelaOptions()
    tokens = iter(flags)
    for token in tokens:
        flag, has_value, value = token.partition("=")
        if flag in _VALUE_FLAGS:
            if not has_value:
                value = next(tokens, None)
                if value is None or value.startswith("--"):
                    raise TosakitError(f"Vela flag {flag} needs a value", f"write {flag}=VALUE")
            _VALUE_FLAGS[flag](opts, flag, value)
        elif flag in _SWITCH_FLAGS:
            if has_value:
                raise TosakitError(f"Vela flag {flag} takes no value (got {token!r})", f"write just {flag}")
            _switch(opts, flag)
        else:
            raise _unsupported(token)
    for name, flag in (("accelerator", "--accelerator-config"), ("system_config", "--system-config"),
                       ("memory_mode", "--memory-mode")):
        if getattr(opts, name) is None:
            raise TosakitError(f"the Vela flags name no {flag}", "build the flags with EthosUCompileSpec")
    return opts


# ---------------------------------------------------------------- vela config


class _VelaConfig:
    """The selected system config and memory mode of one or more Vela .ini files."""

    def __init__(self, opts: VelaOptions):
        self.paths = [resolve_vela_config(c) for c in (opts.configs or ["Arm/vela.ini"])]
        self.parser = configparser.ConfigParser()
        self.parser.read(self.paths)
        self.system = self._section("System_Config", opts.system_config)
        self.mode = self._section("Memory_Mode", opts.memory_mode)
        self.clock_hz = self.number(self.system, "core_clock", 1.0, float, 1.0, "a frequency in Hz, like 500e6")

    def _section(self, kind: str, name: str) -> str:
        section = f"{kind}.{name}"
        if not self.parser.has_section(section):
            names = [s.split(".", 1)[1] for s in self.parser.sections() if s.startswith(kind + ".")]
            raise TosakitError(f"Vela config has no {kind} {name!r}", did_you_mean(name, names))
        return section

    def get(self, section: str, key: str, default: str) -> str:
        """A key of a section, following Vela's ``inherit=`` chains."""
        seen = []
        while section not in seen:
            seen.append(section)
            if self.parser.has_option(section, key):
                return self.parser.get(section, key)
            if not self.parser.has_option(section, "inherit"):
                break
            section = self.parser.get(section, "inherit")
        return default

    def text(self) -> str:
        """All the .ini files, one after the other, as regor reads them."""
        return "".join(p.read_text(encoding="utf-8") for p in self.paths)

    def number(self, section: str, key: str, default: float, kind: type, minimum: float, rule: str):
        """A numeric key, parsed with ``kind`` (int or float), at least ``minimum``."""
        text = self.get(section, key, str(default))
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise TosakitError(f"{key}={text!r} in [{section}] of the Vela config is invalid", f"write {rule}")
        return value

    def read_only_shares_sram(self) -> bool:
        """True when Vela treats the constant area as on-chip flash (Sram_Only-like modes)."""
        ports = {"Axi0": self.get(self.system, "axi0_port", "Sram"),
                 "Axi1": self.get(self.system, "axi1_port", "Sram")}
        areas = [self.get(self.mode, f"{kind}_mem_area", "Axi0") for kind in ("const", "arena", "cache")]
        const = ports.get(areas[0])
        return const == "OnChipFlash" or (const == "Sram" and len(set(areas)) == 1)


def _regor_arch(target: str) -> tuple[str, int, int]:
    """Regor's accelerator name, MACs per cycle and core count for a Vela target."""
    family = npu_family(target)
    name = "".join(part.capitalize() for part in family.split("-"))
    if target == "ethos-u65-512":
        return name, 256, 2
    return name, ETHOSU_TARGETS[target], 1


def _arena_size_limit(opts: VelaOptions, config: _VelaConfig) -> int:
    address_bits = 32 if npu_family(opts.accelerator) == "ethos-u55" else 40
    limit = opts.arena_cache_size
    if limit is None:
        limit = config.number(config.mode, "arena_cache_size", 1 << address_bits, int, 0, "a size in bytes")
    if limit > 1 << address_bits:
        raise TosakitError(
            f"arena cache size {limit} is larger than {opts.accelerator} can address",
            f"use at most {1 << address_bits} bytes",
        )
    return limit


def _system_text(opts: VelaOptions, config: _VelaConfig) -> str:
    _, macs, cores = _regor_arch(opts.accelerator)
    head = (f"[architecture]\nmacs={macs}\ncores={cores}\n"
            f"[vela]\nsystem_config_name={opts.system_config}\nmemory_mode_name={opts.memory_mode}\n")
    return head + config.text()


def _options_text(opts: VelaOptions, config: _VelaConfig) -> str:
    sections = {
        # The optimisation database is always on: it feeds the per-operator report.
        "compiler": ["enable_db=true", "output_format=Raw", f"cop_format={opts.cop_format}"],
        "scheduler": [
            f"optimize={opts.optimise}",
            f"arena_size_limit={_arena_size_limit(opts, config)}",
            "disable_feature=" + "|".join(dict.fromkeys(opts.disabled_features)),
            f"cpu_tensor_alignment={opts.cpu_tensor_alignment}",
            f"tensor_allocator={opts.tensor_allocator}",
        ],
        "graph": [f"softmax_int16_neg_exp_range={opts.softmax_int16_neg_exp_range}"],
    }
    for section, key in dict.fromkeys(opts.verbose):
        sections[section].append(f"{key}=true")
    return "".join(f"\n[{name}]\n" + "".join(line + "\n" for line in lines) for name, lines in sections.items())


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


def _run_regor(tosa: bytes, opts: VelaOptions, config: _VelaConfig, listing: list[str] | None = None):
    """regor's compiled model; what it printed is echoed for the verbose flags, or appended to ``listing``."""
    name, _, _ = _regor_arch(opts.accelerator)
    system, options = _system_text(opts, config), _options_text(opts, config)
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


def _memory_figures(perf, config: _VelaConfig) -> tuple[dict[str, int], dict[str, int]]:
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


def _report(model, tosa: bytes, opts: VelaOptions, config: _VelaConfig) -> VelaReport:
    perf = model.perf_report
    _, macs, cores = _regor_arch(opts.accelerator)
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


def _check_sram(report: VelaReport, opts: VelaOptions, config: _VelaConfig) -> None:
    """Vela overruns a too-small arena cache silently; a program that needs more SRAM than the memory mode
    gives it cannot run, so say so."""
    limit = _arena_size_limit(opts, config)
    if report.sram_used_bytes <= limit:
        return
    advice = [] if opts.optimise == "Size" else ["--optimise Size (trades cycles for SRAM)"]
    if npu_family(opts.accelerator) != "ethos-u55" and not opts.memory_mode.startswith("Dedicated_Sram"):
        advice.insert(0, "memory mode Dedicated_Sram (the arena in DRAM, SRAM as its cache)")
    advice.append("a larger --arena-cache-size, if the device has the SRAM")
    raise TosakitError(
        f"the program needs {report.sram_used_bytes / 1024:.1f} KiB of SRAM at its peak, more than the "
        f"{limit / 1024:.1f} KiB that {opts.memory_mode} on {opts.system_config} allows (arena cache size)",
        "try " + ", or ".join(advice))


def compile_tosa(tosa: bytes, spec: EthosUCompileSpec) -> VelaResult:
    """Compile a TOSA 1.0 flatbuffer with Vela, honouring ``spec.compiler_flags``."""
    tosa = bytes(tosa)
    if len(tosa) < 8 or tosa[4:8] != b"TOSA":
        raise TosakitError("the bytes given to Vela are not a TOSA flatbuffer (no 'TOSA' identifier)",
                           "pass the output of the TOSA serializer")
    opts = parse_vela_flags(list(spec.compiler_flags))
    config = _VelaConfig(opts)
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
    model = _run_regor(bytes(tosa), opts, _VelaConfig(opts), printed)
    tables = {name: _table(model.opt_database, name) for name in ("queue", "optimised", "source")}
    return VelaRecords(bytes(model.command_stream), printed[0], tables, _tosa_blocks(tosa))
