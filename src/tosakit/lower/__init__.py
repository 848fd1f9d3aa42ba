"""Stage 4: lower partitions to TOSA 1.0 (INT profile for quantized ops, FP for float).

``TOSAPartitioner`` reads the same rule table the lowering uses, so what it
delegates is exactly what ``lower_partition`` can lower.
"""

from __future__ import annotations

from typing import Sequence

from torch.fx import GraphModule, Node
from torch.fx.passes.operator_support import OperatorSupportBase

from ..capture import PRESERVED_OPS, CapturedProgram
from ..errors import TosakitError
from ..partition import DelegationSpec, Partitioner, PartitionResult
from ..specs import ArmCompileSpec, TosaSpecification
from . import rules  # noqa: F401  (fills the rule table)
from .lowering import RULES, LoweredGraph, OpSupport, lower_graph, support_reason
from .int64 import int32_ids
from .passes import PARTITION_PIPELINE, PROGRAM_PIPELINE, quantized_io, run
from .transpose import Case, ChooseForm, TransposeCase

__all__ = [
    "RULES",
    "Case",
    "ChooseForm",
    "TransposeCase",
    "OpSupport",
    "LoweredGraph",
    "TOSAPartitioner",
    "lower_partition",
    "prepare_program",
    "quantized_io",
    "int32_ids",
    "support_reason",
]


def prepare_program(gm: GraphModule) -> GraphModule:
    """Whole-program passes that run before partitioning."""
    return run(PROGRAM_PIPELINE, gm)


def lower_partition(gm: GraphModule, tosa_spec: TosaSpecification, probes: bool = False,
                    choose: ChooseForm | None = None) -> LoweredGraph:
    """Run the partition passes, then lower the graph to TOSA (``probes``: every op's result an output too;
    ``choose``: the backend's pick among equivalent forms, e.g. of each TRANSPOSE)."""
    return lower_graph(run(PARTITION_PIPELINE, gm), tosa_spec, probes, choose)


class TOSAPartitioner:
    """Partitions what lowers to TOSA for a compile spec (raw TOSA output by default)."""

    def __init__(self, compile_spec: ArmCompileSpec, additional_checks: Sequence[OperatorSupportBase] | None = None):
        if not isinstance(compile_spec, ArmCompileSpec):
            raise TosakitError(
                f"{type(self).__name__} needs a compile spec object, got {type(compile_spec).__name__}",
                "pass e.g. EthosUCompileSpec('ethos-u55-128'), VgfCompileSpec() or TosaCompileSpec('TOSA-1.0+INT')",
            )
        self.compile_spec = compile_spec
        self.additional_checks = list(additional_checks or [])
        self.delegation_spec = DelegationSpec(compile_spec.backend_id, compile_spec.to_list())

    def target_reason(self, node: Node) -> str | None:
        """Limits of this particular target beyond the TOSA profile (none for raw TOSA)."""
        return None

    def support(self, node: Node) -> str | None:
        return support_reason(node, self.compile_spec.tosa_spec) or self.target_reason(node)

    def ops_to_not_decompose(self, ep=None):
        """Ops kept whole when decomposing to core ATen, and no extra filter."""
        return list(PRESERVED_OPS), None

    def partition(self, program: CapturedProgram) -> PartitionResult:
        """Tag the delegated subgraphs of ``program`` and explain every op left on the CPU."""
        spec = self.compile_spec.tosa_spec
        partitioner = Partitioner(self.delegation_spec, self.support, integer_io_only=not spec.support_float(),
                                  additional_checks=self.additional_checks)
        return partitioner.partition_graph(program.graph_module)

