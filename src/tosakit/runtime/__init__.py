"""Stage 7: run on the host — TOSA on the reference model, delegates checked against PyTorch."""

from .reference import DelegateCheck, check_delegates, compare, evaluate_exact, run_edge, run_tosa

__all__ = ["DelegateCheck", "check_delegates", "compare", "evaluate_exact", "run_edge", "run_tosa"]
