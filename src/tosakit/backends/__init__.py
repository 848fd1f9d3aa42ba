"""Stage 5: turn a partition's TOSA into the payload its backend stores in the .pte.

``prepare_delegate`` loads every backend (``dispatch``) and compiles a partition with the one its spec
names: ``TOSABackend``, ``EthosUBackend`` (Vela) or ``VgfBackend`` (model-converter); each registers itself
in ``registry`` (``preprocess`` there finds a backend only once ``load_backends()`` has run).
"""

from ..lazy import lazy_exports

__all__ = ["PreprocessResult", "PreparedDelegate", "backend", "compile_lowered", "form_choice", "lower_for",
           "load_backends", "preprocess", "prepare_delegate"]
__getattr__, __dir__ = lazy_exports(__name__, {**{n: ".registry" for n in __all__}, "prepare_delegate": ".dispatch",
                                               "load_backends": ".dispatch"})
