"""TOSABackend: the delegate payload is the TOSA 1.0 flatbuffer itself."""

from __future__ import annotations

from ...lower import LoweredGraph
from ...specs import ArmCompileSpec
from ..registry import PreprocessResult, backend


@backend("TOSABackend")
def preprocess(lowered: LoweredGraph, spec: ArmCompileSpec) -> PreprocessResult:
    """Store the TOSA flatbuffer as is."""
    return PreprocessResult(lowered.tosa, None, {"tosa": lowered.tosa})
