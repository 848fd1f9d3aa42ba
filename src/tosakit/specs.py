"""Targets and compile specs: which TOSA profile, which NPU, which Vela flags.

This is the base layer every stage reads. Names and signatures follow the
ExecuTorch Arm backend (``EthosUCompileSpec``, ``VgfCompileSpec``, ...).
"""

from __future__ import annotations

import configparser
import json
import enum
import functools
import importlib.util
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .errors import TosakitError, did_you_mean
from .targets import CORTEX_M_ISA, ETHOSU_TARGETS, VGF_TARGET, Target, parse_target


@dataclass(frozen=True)
class CompileSpec:
    """One key/value pair stored with a delegate in the .pte (value is bytes)."""

    key: str
    value: bytes


# --------------------------------------------------------------------------- TOSA

TOSA_PROFILES = ("INT", "FP")
TOSA_EXTENSIONS = ("int16", "int4", "int64", "bf16", "fp8e4m3", "fp8e5m2", "cf", "u55", "variable", "shape")


@dataclass(frozen=True)
class TosaSpecification:
    """A TOSA target such as ``TOSA-1.0+INT+int16``: version, profiles, extensions."""

    version: tuple[int, int]
    profiles: tuple[str, ...]
    extensions: tuple[str, ...] = ()

    @classmethod
    def create_from_string(cls, text: str) -> "TosaSpecification":
        """Parse ``TOSA-<major>.<minor>+PROFILE[+PROFILE][+ext...]``."""
        parts = text.strip().split("+")
        head = parts[0]
        if not head.upper().startswith("TOSA-"):
            raise TosakitError(
                f"TOSA specification {text!r} must start with 'TOSA-1.0'",
                "write it like 'TOSA-1.0+INT' or 'TOSA-1.0+FP+INT+int16'",
            )
        try:
            major, minor = (int(x) for x in head[5:].split("."))
        except ValueError:
            raise TosakitError(f"TOSA specification {text!r} has no valid version", "use 'TOSA-1.0+INT'") from None
        if (major, minor) != (1, 0):
            raise TosakitError(
                f"TOSA version {major}.{minor} in {text!r} is not supported",
                "tosakit writes TOSA 1.0 (the version Vela 5.2 and model-converter read): use 'TOSA-1.0+...'",
            )
        profiles, extensions = [], []
        for p in parts[1:]:
            if p.upper() in TOSA_PROFILES:
                profiles.append(p.upper())
            elif p.lower() in TOSA_EXTENSIONS:
                extensions.append(p.lower())
            else:
                raise TosakitError(
                    f"unknown TOSA profile or extension {p!r} in {text!r}",
                    f"profiles: {', '.join(TOSA_PROFILES)}; extensions: {', '.join(TOSA_EXTENSIONS)}",
                )
        if not profiles:
            raise TosakitError(f"TOSA specification {text!r} names no profile", "add '+INT' and/or '+FP'")
        return cls((major, minor), tuple(profiles), tuple(extensions))

    def support_integer(self) -> bool:
        return "INT" in self.profiles

    def support_float(self) -> bool:
        return "FP" in self.profiles

    def support_extension(self, ext: str) -> bool:
        return ext in self.extensions

    @property
    def is_u55_subset(self) -> bool:
        """True when only the Ethos-U55/U65 subset of TOSA may be used."""
        return "u55" in self.extensions

    def __str__(self) -> str:
        return "+".join([f"TOSA-{self.version[0]}.{self.version[1]}", *self.profiles, *self.extensions])


# --------------------------------------------------------------------- Vela flags

VELA_INI = "Arm/vela.ini"  # the .ini Vela ships, in its config_files folder
VELA_GOALS = ("Size", "Performance")  # what --optimise takes
_ETHOSU_ONLY_HINT = "drop them, or choose an ethos-u55/u65/u85 target"


def _invalid(flag: str, value: str, hint: str) -> TosakitError:
    return TosakitError(f"invalid value {value!r} for Vela flag {flag}", hint)


def flag_choice(flag: str, value: str, choices) -> str:
    """``value`` if it is one of ``choices``; else an error naming the Vela flag and the choices."""
    if value not in choices:
        raise _invalid(flag, value, did_you_mean(value, choices))
    return value


def flag_number(flag: str, value: str, kind: type, valid: Callable[[float], bool], rule: str):
    """``value`` read as a ``kind`` (int or float) that is ``valid``; else an error saying the ``rule``."""
    try:
        number = kind(value)
    except ValueError:
        number = None
    if number is None or not valid(number):
        raise _invalid(flag, value, f"it must be {rule}")
    return number


def read_arena_cache_size(value: str) -> int:
    """A ``--arena-cache-size`` value: bytes, at least 0."""
    return flag_number("--arena-cache-size", value, int, lambda n: n >= 0, "a size in bytes (>= 0)")


def _vela_config_dir() -> Path | None:
    spec = importlib.util.find_spec("ethosu")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "config_files"


def resolve_vela_config(config_ini: str) -> Path:
    """Find a Vela .ini by path or by name inside Vela's own config_files folder."""
    direct = Path(config_ini)
    if direct.is_file():
        return direct.resolve()
    base = _vela_config_dir()
    if base is not None and (base / config_ini).is_file():
        return base / config_ini
    raise TosakitError(
        f"Vela configuration file {config_ini!r} not found",
        "pass a readable .ini path, or 'Arm/vela.ini' for the one Vela ships",
    )


def parsed_vela_config(paths: list[Path]) -> configparser.ConfigParser:
    """Vela .ini files parsed as one, once per version of each file (every Vela call of a compile asks); the
    parser is shared: read it, never write it."""
    return _parsed(tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths))


@functools.lru_cache(maxsize=16)
def _parsed(files: tuple[tuple[str, int, int], ...]) -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read([name for name, _, _ in files])
    return parser


def vela_config_sections(config_ini: str) -> tuple[list[str], list[str]]:
    """System configs and memory modes named in a Vela .ini file."""
    parser = parsed_vela_config([resolve_vela_config(config_ini)])
    systems = [s.split(".", 1)[1] for s in parser.sections() if s.startswith("System_Config.")]
    modes = [s.split(".", 1)[1] for s in parser.sections() if s.startswith("Memory_Mode.")]
    return systems, modes


# ------------------------------------------------------------------ compile specs


class DebugMode(enum.Enum):
    """What ``dump_debug_info`` writes beside the intermediates."""

    JSON = 1
    TOSA = 2


@dataclass
class ArmCompileSpec:
    """What all Arm targets share: a TOSA spec, compiler flags, debug outputs."""

    tosa_spec: TosaSpecification
    compiler_flags: list[str] = field(default_factory=list)
    path_for_intermediates: str | None = None
    tosa_debug_mode: DebugMode | None = None
    # Carry each delegate's TOSA inside the .pte (named data) so the host runtime can run it.
    embed_tosa: bool = False
    # Keep quantized model inputs/outputs as integers (no CPU quantize/dequantize around them).
    preserve_io_quantization: bool = False
    # The Cortex-M core whose cortex_m:: kernels run what the delegate leaves on the CPU (None: portable kernels).
    cortex_m_fallback: str | None = None

    output_format = "tosa"
    backend_id = "TOSABackend"

    def dump_intermediate_artifacts_to(self, output_path: str | None):
        """Set a folder for intermediate results (TOSA, Vela output, report)."""
        self.path_for_intermediates = None if output_path is None else str(output_path)
        return self

    def get_intermediate_path(self) -> str | None:
        """The folder intermediates are written to, if any."""
        return self.path_for_intermediates

    def with_debug_info(self, enabled: bool = True):
        """Carry each delegate's TOSA inside the .pte, so the host runtime (``tosakit run``) can run it."""
        self.embed_tosa = enabled
        return self

    def with_int8_io(self, enabled: bool = True):
        """The program takes and returns the quantized integers (int8, or int16 with a16w8) instead of
        float: no CPU quantize/dequantize around the delegate, firmware feeds the NPU directly."""
        self.preserve_io_quantization = enabled
        return self

    def with_cortex_m_fallback(self, core: str | None = "cortex-m55"):
        """Run the quantized layers the delegate refuses, and its boundary quantize/dequantize, as ``core``'s
        cortex_m:: kernels (CMSIS-NN) instead of float portable kernels."""
        if core is not None:
            flag_choice("--cortex-m-fallback", core.strip().lower(), CORTEX_M_ISA)
        self.cortex_m_fallback = None if core is None else core.strip().lower()
        return self

    def dump_debug_info(self, debug_mode: DebugMode | None):
        """Write extra debug information into the intermediates folder."""
        self.tosa_debug_mode = debug_mode
        return self

    @classmethod
    def get_output_format(cls) -> str:
        """The delegate payload kind this spec produces ('tosa', 'vela', 'vgf')."""
        return cls.output_format

    def to_list(self) -> list[CompileSpec]:
        """The compile specs stored beside the delegate, in ExecuTorch's key order."""
        specs = [CompileSpec("tosa_spec", str(self.tosa_spec).encode())]
        if self.compiler_flags:
            specs.append(CompileSpec("compile_flags", " ".join(self.compiler_flags).encode()))
        specs.append(CompileSpec("output_format", self.get_output_format().encode()))
        if self.path_for_intermediates is not None:
            specs.append(CompileSpec("debug_artifact_path", self.path_for_intermediates.encode()))
        return specs

    @property
    def target_name(self) -> str:
        return str(self.tosa_spec)


def _as_flag_list(flags) -> list[str]:
    if flags is None:
        return []
    if isinstance(flags, str):
        return shlex.split(flags)
    return [str(f) for f in flags]


class TosaCompileSpec(ArmCompileSpec):
    """Compile spec for raw TOSA output (``TOSABackend``)."""

    def __init__(self, tosa_spec: TosaSpecification | str = "TOSA-1.0+INT"):
        if isinstance(tosa_spec, str):
            tosa_spec = TosaSpecification.create_from_string(tosa_spec)
        super().__init__(tosa_spec=tosa_spec)


class VgfCompileSpec(ArmCompileSpec):
    """Compile spec for VGF (ML SDK for Vulkan) through ``model-converter``."""

    output_format = "vgf"
    backend_id = "VgfBackend"

    def __init__(self, tosa_spec: TosaSpecification | str | None = None, compiler_flags: list[str] | None = None):
        if tosa_spec is None:
            tosa_spec = VGF_TARGET.tosa
        if isinstance(tosa_spec, str):
            tosa_spec = TosaSpecification.create_from_string(tosa_spec)
        super().__init__(tosa_spec=tosa_spec, compiler_flags=_as_flag_list(compiler_flags))

    @property
    def target_name(self) -> str:
        return "vgf"


class CortexMCompileSpec(ArmCompileSpec):
    """The direct flow on a Cortex-M core: no delegate; quantized patterns become ExecuTorch's ``cortex_m::``
    kernels (CMSIS-NN), for the class of kernels the core runs (``isa``: SCALAR, DSP or MVE; by default the
    core's best, a lesser one for a core built without its extension)."""

    backend_id = "CortexM"

    def __init__(self, target: str = "cortex-m55", isa: str | None = None):
        core = flag_choice("--target", target.strip().lower(), CORTEX_M_ISA)
        order = ("SCALAR", "DSP", "MVE")
        best = CORTEX_M_ISA[core]
        if isa is not None and (isa not in order or order.index(isa) > order.index(best)):
            raise TosakitError(f"{core} cannot run {isa} kernels: it runs {', '.join(order[:order.index(best) + 1])}",
                               "choose one of those, or leave the instruction set to the core")
        super().__init__(tosa_spec=TosaSpecification.create_from_string("TOSA-1.0+INT"))  # what its quantizer reads
        self.target, self.isa = core, isa or best

    @property
    def target_name(self) -> str:
        return self.target


@dataclass(frozen=True)
class VelaExternalBlockPlacements:
    """Which of Vela's blocks leave the payload for a named-data file, by tag (``<tag>.ptd``), as ExecuTorch's
    Ethos-U backend places them; None keeps a block inline."""

    cmd_data: str | None = None
    weight_data: str | None = None

    def __post_init__(self):
        for name, tag in self.blocks().items():
            if not tag or not tag.isascii() or not tag.isprintable():
                raise TosakitError(f"external block placement {name}={tag!r}: tags are non-empty printable ASCII",
                                   "name the .ptd file, e.g. VelaExternalBlockPlacements(weight_data='weights')")

    def blocks(self) -> dict[str, str]:
        """Block name -> tag, for the blocks placed outside."""
        return {name: tag for name, tag in (("cmd_data", self.cmd_data), ("weight_data", self.weight_data))
                if tag is not None}


class EthosUCompileSpec(ArmCompileSpec):
    """Compile spec for an Ethos-U NPU, compiled by Vela."""

    output_format = "vela"
    backend_id = "EthosUBackend"

    def __init__(
        self,
        target: str,
        system_config: str | None = None,
        memory_mode: str | None = None,
        extra_flags: list[str] | str | None = None,
        config_ini: str | None = VELA_INI,
        optimise: str | None = None,
        arena_cache_size: int | None = None,
        external_block_placements: VelaExternalBlockPlacements | None = None,
    ):
        target = target.strip().lower()
        if target not in ETHOSU_TARGETS:
            raise TosakitError(f"unknown Ethos-U target {target!r}", did_you_mean(target, ETHOSU_TARGETS))
        npu = ETHOSU_TARGETS[target]
        config_ini = config_ini or VELA_INI
        systems, modes = vela_config_sections(config_ini)
        system_config = system_config or npu.system_config
        memory_mode = memory_mode or npu.memory_mode
        if system_config not in systems:
            raise TosakitError(
                f"unknown system config {system_config!r} (not in {config_ini})", did_you_mean(system_config, systems)
            )
        if memory_mode not in modes:
            raise TosakitError(
                f"unknown memory mode {memory_mode!r} (not in {config_ini})", did_you_mean(memory_mode, modes)
            )
        if npu.family == "u55" and memory_mode.startswith("Dedicated_Sram"):
            raise TosakitError(
                f"memory mode {memory_mode!r} is not available on {target}",
                "Ethos-U55 has no dedicated SRAM interface: use Shared_Sram or Sram_Only",
            )
        prefix = npu.product.replace("-", "_")
        if system_config.lower().startswith("ethos_u") and not system_config.lower().startswith(prefix):
            expected = [s for s in systems if s.lower().startswith(prefix)]
            raise TosakitError(
                f"system config {system_config!r} is not for {target}",
                f"choose one made for {npu.product}: {', '.join(expected)}",
            )
        self.target = target
        self.npu: Target = npu
        self.system_config = system_config
        self.memory_mode = memory_mode
        self.config_ini = config_ini
        self.extra_flags = _as_flag_list(extra_flags)
        self.optimise = flag_choice("--optimise", optimise, VELA_GOALS) if optimise else None
        self.arena_cache_size = None if arena_cache_size is None else read_arena_cache_size(str(arena_cache_size))
        self.external_block_placements = external_block_placements or VelaExternalBlockPlacements()
        super().__init__(tosa_spec=TosaSpecification.create_from_string(npu.tosa), compiler_flags=self._vela_flags())

    def _vela_flags(self) -> list[str]:
        """The Vela flags stored in the .pte: the extra ones, the typed options, then the target's."""
        return [
            *self.extra_flags,
            *([f"--optimise={self.optimise}"] if self.optimise else []),
            *([f"--arena-cache-size={self.arena_cache_size}"] if self.arena_cache_size is not None else []),
            f"--accelerator-config={self.target}",
            f"--config={self.config_ini}",
            "--output-format=raw",
            f"--system-config={self.system_config}",
            f"--memory-mode={self.memory_mode}",
        ]

    @property
    def macs(self) -> int:
        return self.npu.macs

    @property
    def target_name(self) -> str:
        return self.target

    def to_list(self) -> list[CompileSpec]:
        placed = self.external_block_placements.blocks()
        return [*super().to_list(), CompileSpec("target", self.target.encode()),
                *([CompileSpec("external_block_placements", json.dumps(placed, sort_keys=True,
                                                                       separators=(",", ":")).encode())]
                  if placed else [])]


_HOW_TO_MAKE = {
    "EthosUCompileSpec": "EthosUCompileSpec('ethos-u55-128')",
    "VgfCompileSpec": "VgfCompileSpec()",
}


def require_spec(spec, cls: type, user: str):
    """``spec`` if it is a ``cls``; otherwise an error that says how to make one."""
    if not isinstance(spec, cls):
        article = "an" if cls.__name__[0] in "AEIOU" else "a"
        raise TosakitError(f"{user} needs {article} {cls.__name__}, got {type(spec).__name__}",
                           f"create it with {_HOW_TO_MAKE.get(cls.__name__, cls.__name__ + '(...)')}")
    return spec


def compile_spec_for_target(
    target: str,
    system_config: str | None = None,
    memory_mode: str | None = None,
    extra_flags: list[str] | str | None = None,
    config_ini: str | None = None,
    optimise: str | None = None,
    arena_cache_size: int | None = None,
) -> ArmCompileSpec:
    """The compile spec for a CLI target name (ethos-u*, vgf, TOSA-1.0+INT/FP); the Vela options are for
    Ethos-U targets only."""
    if target.strip().lower() in CORTEX_M_ISA:
        return CortexMCompileSpec(target)
    record = ETHOSU_TARGETS.get(target.strip().lower())
    if record is not None:
        return EthosUCompileSpec(record.name, system_config, memory_mode, extra_flags, config_ini, optimise,
                                 arena_cache_size)
    if system_config or memory_mode:
        raise TosakitError(
            f"--system_config/--memory_mode only apply to Ethos-U targets, not {target!r}", _ETHOSU_ONLY_HINT)
    if optimise or arena_cache_size is not None:
        raise TosakitError(f"--optimise/--arena-cache-size only apply to Ethos-U targets, not {target!r}",
                           _ETHOSU_ONLY_HINT)
    record = parse_target(target)
    if record.name == "vgf":
        return VgfCompileSpec(compiler_flags=extra_flags)
    return TosaCompileSpec(record.tosa)


class ArmCompileSpecBuilder:
    """The older builder API: ``ArmCompileSpecBuilder().ethosu_compile_spec(...).build()``."""

    def __init__(self):
        self._spec: ArmCompileSpec | None = None
        self._intermediates: str | None = None

    def ethosu_compile_spec(self, target, system_config=None, memory_mode=None, extra_flags=None, config_ini=VELA_INI):
        self._spec = EthosUCompileSpec(target, system_config, memory_mode, extra_flags, config_ini)
        return self

    def tosa_compile_spec(self, tosa_spec="TOSA-1.0+INT"):
        self._spec = TosaCompileSpec(tosa_spec)
        return self

    def vgf_compile_spec(self, tosa_spec=None, compiler_flags=None):
        self._spec = VgfCompileSpec(tosa_spec, compiler_flags)
        return self

    def dump_intermediate_artifacts_to(self, output_path):
        self._intermediates = output_path
        return self

    def build(self) -> ArmCompileSpec:
        if self._spec is None:
            raise TosakitError("ArmCompileSpecBuilder.build() called before choosing a target",
                               "call .ethosu_compile_spec(...), .vgf_compile_spec(...) or .tosa_compile_spec(...) first")
        return self._spec.dump_intermediate_artifacts_to(self._intermediates) if self._intermediates else self._spec


def generate_ethosu_compile_spec(target, system_config=None, memory_mode=None, extra_flags=None, config_ini=VELA_INI):
    """Older helper: the same as ``EthosUCompileSpec(...)``."""
    return EthosUCompileSpec(target, system_config, memory_mode, extra_flags, config_ini)


def generate_tosa_compile_spec(tosa_spec="TOSA-1.0+INT"):
    """Older helper: the same as ``TosaCompileSpec(...)``."""
    return TosaCompileSpec(tosa_spec)


def generate_vgf_compile_spec(tosa_spec=None, compiler_flags=None):
    """Older helper: the same as ``VgfCompileSpec(...)``."""
    return VgfCompileSpec(tosa_spec, compiler_flags)
