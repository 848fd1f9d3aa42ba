"""Stage 7: run on the host — .pte programs, TOSA on the reference model, checks against PyTorch."""

from .program import LoadedProgram, TensorSpec, load
from .reference import DelegateCheck, check_delegates, compare, evaluate_exact, run_edge, run_tosa

__all__ = ["DelegateCheck", "LoadedProgram", "TensorSpec", "check_delegates", "compare", "evaluate_exact", "load",
           "run_edge", "run_tosa"]
