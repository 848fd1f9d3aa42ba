"""The backends' registry: each backend registers its preprocess function and form choice here, by runtime
id; this module imports no backend (``dispatch`` loads them all)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from torch.fx import GraphModule

from ..errors import TosakitError
from ..lower import ChooseForm, LoweredGraph, lower_partition
from ..specs import ArmCompileSpec


@dataclass
class PreprocessResult:
    """A delegate's processed bytes, its compiler report, and files worth keeping (-i)."""

    processed_bytes: bytes
    report: object | None = None
    artifacts: dict[str, bytes] = field(default_factory=dict)
    external: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # key -> (.ptd tag, bytes) moved out
    inline_bytes: bytes | None = None  # with external blocks: the payload with them in place


@dataclass
class PreparedDelegate:
    """A partition lowered and compiled: the graph it replaces, its TOSA, and the backend's result."""

    original: GraphModule
    lowered: LoweredGraph
    result: PreprocessResult


Preprocess = Callable[[LoweredGraph, ArmCompileSpec], PreprocessResult]
BACKENDS: dict[str, Preprocess] = {}
FORM_CHOICE: dict[str, Callable[[ArmCompileSpec], ChooseForm]] = {}


def backend(backend_id: str):
    """Register a backend's preprocess function under its runtime id."""

    def register(fn: Preprocess) -> Preprocess:
        BACKENDS[backend_id] = fn
        return fn

    return register


def form_choice(backend_id: str):
    """Register how a backend picks among equivalent lowerings (``lower.transpose``) for a compile spec."""

    def register(fn: Callable[[ArmCompileSpec], ChooseForm]):
        FORM_CHOICE[backend_id] = fn
        return fn

    return register


def lower_for(gm: GraphModule, spec: ArmCompileSpec) -> LoweredGraph:
    """Lower a partition to TOSA in the forms ``spec``'s backend compiles best."""
    choice = FORM_CHOICE.get(spec.backend_id)
    return lower_partition(gm, spec.tosa_spec, choose=choice(spec) if choice else None)


def preprocess(backend_id: str, lowered: LoweredGraph, spec: ArmCompileSpec) -> PreprocessResult:
    """Compile a lowered partition for ``backend_id``."""
    try:
        fn = BACKENDS[backend_id]
    except KeyError:
        raise TosakitError(f"unknown backend {backend_id!r}", f"known backends: {', '.join(sorted(BACKENDS))}") from None
    return fn(lowered, spec)


def compile_lowered(original: GraphModule, lowered: LoweredGraph, spec: ArmCompileSpec) -> PreparedDelegate:
    """Compile an already lowered partition (``original``: the graph it replaces) for ``spec``'s backend."""
    return PreparedDelegate(original, lowered, preprocess(spec.backend_id, lowered, spec))
