"""What Vela is told: its flags (``--flag=value`` as the ``vela`` command line reads them, and the typed
options of an ``EthosUCompileSpec``), the selected sections of its .ini files, and the text regor reads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ...errors import TosakitError, did_you_mean
from ...specs import (VELA_GOALS, VELA_INI, EthosUCompileSpec, flag_choice, flag_number, parsed_vela_config,
                      read_arena_cache_size, resolve_vela_config)
from ...targets import ETHOSU_TARGETS, Target


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

    @property
    def npu(self) -> Target:
        """The accelerator's record."""
        return ETHOSU_TARGETS[self.accelerator]


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


def _set(name: str, convert: Callable[[str, str], object]) -> Callable[[VelaOptions, str, str], None]:
    return lambda opts, flag, value: setattr(opts, name, convert(flag, value))


_VALUE_FLAGS: dict[str, Callable[[VelaOptions, str, str], None]] = {
    "--accelerator-config": _set("accelerator", lambda f, v: flag_choice(f, v.lower(), ETHOSU_TARGETS)),
    "--config": lambda opts, flag, value: opts.configs.append(value),
    "--system-config": _set("system_config", lambda f, v: v),
    "--memory-mode": _set("memory_mode", lambda f, v: v),
    "--output-format": lambda opts, flag, value: flag_choice(flag, value, ("raw",)),
    "--optimise": _set("optimise", lambda f, v: flag_choice(f, v, VELA_GOALS)),
    "--arena-cache-size": _set("arena_cache_size", lambda f, v: read_arena_cache_size(v)),
    "--cpu-tensor-alignment": _set("cpu_tensor_alignment", lambda f, v: flag_number(
        f, v, int, lambda n: n >= 16 and n & (n - 1) == 0, "a power of 2, at least 16")),
    "--tensor-allocator": _set(
        "tensor_allocator", lambda f, v: flag_choice(f, v, ("LinearAlloc", "Greedy", "HillClimb"))),
    "--cop-format": _set("cop_format", lambda f, v: flag_choice(f, v, ("COP1", "COP2"))),
    "--experimental-softmax-int16-neg-exp-range": _set("softmax_int16_neg_exp_range", lambda f, v: flag_number(
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


def _read_flags(flags: list[str], opts: VelaOptions) -> VelaOptions:
    """``opts`` with Vela command-line flags (``--flag=value`` or ``--flag value``) read over it; later ones win."""
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
    return opts


def parse_vela_flags(flags: list[str]) -> VelaOptions:
    """Read the Vela flags stored with a delegate; they must name the accelerator, system config and memory mode."""
    opts = _read_flags(flags, VelaOptions())
    for name, flag in (("accelerator", "--accelerator-config"), ("system_config", "--system-config"),
                       ("memory_mode", "--memory-mode")):
        if getattr(opts, name) is None:
            raise TosakitError(f"the Vela flags name no {flag}", "build the flags with EthosUCompileSpec")
    return opts


def vela_options(spec: EthosUCompileSpec) -> VelaOptions:
    """What Vela is told for ``spec``: its extra flags, with its typed options and target over them (as the
    flags stored in the .pte say, in that order)."""
    opts = _read_flags(spec.extra_flags, VelaOptions())
    opts.accelerator, opts.system_config, opts.memory_mode = spec.target, spec.system_config, spec.memory_mode
    opts.configs.append(spec.config_ini)
    if spec.optimise:
        opts.optimise = spec.optimise
    if spec.arena_cache_size is not None:
        opts.arena_cache_size = spec.arena_cache_size
    return opts


class VelaConfig:
    """The selected system config and memory mode of one or more Vela .ini files."""

    def __init__(self, opts: VelaOptions):
        self.paths = [resolve_vela_config(c) for c in (opts.configs or [VELA_INI])]
        self.parser = parsed_vela_config(self.paths)  # shared: read, never written
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


def regor_arch(npu: Target) -> tuple[str, int, int]:
    """Regor's accelerator name, MACs per cycle of one core, and core count."""
    return f"Ethos{npu.family.upper()}", npu.macs_per_core, npu.cores


def arena_size_limit(opts: VelaOptions, config: VelaConfig) -> int:
    """The SRAM Vela may use for the arena or its cache: ``--arena-cache-size``, else the memory mode's."""
    address_bits = 32 if opts.npu.family == "u55" else 40
    limit = opts.arena_cache_size
    if limit is None:
        limit = config.number(config.mode, "arena_cache_size", 1 << address_bits, int, 0, "a size in bytes")
    if limit > 1 << address_bits:
        raise TosakitError(
            f"arena cache size {limit} is larger than {opts.accelerator} can address",
            f"use at most {1 << address_bits} bytes",
        )
    return limit


def system_text(opts: VelaOptions, config: VelaConfig) -> str:
    """The architecture and system regor compiles for, then the .ini files."""
    _, macs, cores = regor_arch(opts.npu)
    head = (f"[architecture]\nmacs={macs}\ncores={cores}\n"
            f"[vela]\nsystem_config_name={opts.system_config}\nmemory_mode_name={opts.memory_mode}\n")
    return head + config.text()


def options_text(opts: VelaOptions, config: VelaConfig) -> str:
    """Regor's compiler, scheduler and graph options."""
    sections = {
        # The optimisation database is always on: it feeds the per-operator report.
        "compiler": ["enable_db=true", "output_format=Raw", f"cop_format={opts.cop_format}"],
        "scheduler": [
            f"optimize={opts.optimise}",
            f"arena_size_limit={arena_size_limit(opts, config)}",
            "disable_feature=" + "|".join(dict.fromkeys(opts.disabled_features)),
            f"cpu_tensor_alignment={opts.cpu_tensor_alignment}",
            f"tensor_allocator={opts.tensor_allocator}",
        ],
        "graph": [f"softmax_int16_neg_exp_range={opts.softmax_int16_neg_exp_range}"],
    }
    for section, key in dict.fromkeys(opts.verbose):
        sections[section].append(f"{key}=true")
    return "".join(f"\n[{name}]\n" + "".join(line + "\n" for line in lines) for name, lines in sections.items())
