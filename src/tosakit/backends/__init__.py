"""Stage 5: turn a partition's TOSA into the payload its backend stores in the .pte.

``preprocess(backend_id, lowered, spec)`` dispatches to ``TOSABackend``,
``EthosUBackend`` (Vela) or ``VgfBackend`` (model-converter).
"""

from ..lazy import lazy_exports

__all__ = ["PreprocessResult", "PreparedDelegate", "backend", "compile_lowered", "form_choice", "lower_for",
           "preprocess", "prepare_delegate"]
__getattr__, __dir__ = lazy_exports(__name__, {n: ".dispatch" for n in __all__})
