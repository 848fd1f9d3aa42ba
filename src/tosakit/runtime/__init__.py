"""Stage 7: run on the host — .pte programs, TOSA on the reference model, Ethos-U55/U65 command streams on the
simulator, checks against PyTorch.

A .pte from anywhere is read and validated whole (``validate``) before torch is imported or
anything runs."""

from ..lazy import lazy_exports

_PROGRAM = ["EngineComparison", "LoadedProgram", "Limits", "TensorSpec", "load"]
_REFERENCE = ["DelegateCheck", "check_delegates", "compare", "evaluate_exact", "run_edge", "run_tosa"]
__all__ = [*_PROGRAM, *_REFERENCE]
__getattr__, __dir__ = lazy_exports(__name__, {**{n: ".program" for n in _PROGRAM},
                                               **{n: ".reference" for n in _REFERENCE}})
