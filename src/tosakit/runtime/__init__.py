"""Stage 7: run on the host — .pte programs, TOSA on the reference model, Ethos-U55/U65 and Ethos-U85 command
streams on the simulator, delegates checked against PyTorch.

A .pte from anywhere is read and validated whole (``validate``) before torch is imported or
anything runs."""

from ..lazy import lazy_exports

_PROGRAM = ["LoadedProgram", "Limits", "load"]
_RECORDS = ["EngineComparison", "TensorSpec"]
_DELEGATES = ["DelegateCheck", "check_delegates", "compare", "evaluate_exact", "run_edge"]
_BUNDLED = ["load_bundled", "check_bundled"]
__all__ = [*_PROGRAM, *_RECORDS, *_DELEGATES, *_BUNDLED, "run_tosa"]
__getattr__, __dir__ = lazy_exports(__name__, {**{n: ".program" for n in _PROGRAM},
                                               **{n: ".records" for n in _RECORDS},
                                               **{n: ".delegates" for n in _DELEGATES},
                                               **{n: ".bundled" for n in _BUNDLED},
                                               "run_tosa": ".tosa_inprocess"})
