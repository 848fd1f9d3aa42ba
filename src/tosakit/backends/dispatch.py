"""Dispatch: every backend loaded, a tagged partition lowered to TOSA and compiled by its backend."""

from __future__ import annotations

import copy

from torch.fx import GraphModule

from ..partition.partitioner import extract_subgraph
from ..specs import ArmCompileSpec
from .registry import PreparedDelegate, compile_lowered, lower_for


def prepare_delegate(gm: GraphModule, tag: str, spec: ArmCompileSpec) -> PreparedDelegate:
    """Lower the nodes tagged ``tag`` to TOSA and compile them for ``spec``'s backend."""
    load_backends()
    sub = extract_subgraph(gm, tag)
    original = copy.deepcopy(sub.graph_module)
    return compile_lowered(original, lower_for(sub.graph_module, spec), spec)


def load_backends() -> None:
    """Import every backend, so each registers itself (on first use: Vela is slow to import)."""
    from . import tosa, vgf  # noqa: F401
    from .ethosu import backend  # noqa: F401
