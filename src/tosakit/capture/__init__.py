"""Stage 1: capture a model with ``torch.export`` and bring it to core ATen.

The result every later stage works on is a plain ``GraphModule``: user inputs
are placeholders, parameters and constants are ``get_attr`` attributes. A buffer
forward() updates is state: a placeholder marked ``meta["state"]`` (not a user
input), whose new value is one of the outputs after the user's (``state_writes``).
"""

from .core_aten import (PRESERVED_OPS, CapturedProgram, capture, decomposition_table, direct_core_aten, export,
                        to_core_aten)
from .graph import (FQN, STATE, State, addmm_as_linear, fold_constants, graph_attr, own_state, promote_constants,
                    set_graph_attr, source_of, state_writes, vector_norm_args, with_state, written_attrs)

__all__ = [
    "PRESERVED_OPS", "CapturedProgram", "capture", "decomposition_table", "direct_core_aten", "export", "to_core_aten",
    "FQN", "STATE", "State", "addmm_as_linear", "fold_constants", "graph_attr", "own_state", "promote_constants",
    "set_graph_attr", "source_of", "state_writes", "vector_norm_args", "with_state", "written_attrs",
]
