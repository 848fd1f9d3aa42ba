"""Stage 3: decide which nodes run in a delegate and why the others stay on the CPU.

The partitioner is generic: it is given a support function (``node -> reason or
None``), typically read from the lowering table, plus the user's extra checks.
"""

from .partitioner import DelegationSpec, NodePlacement, Partitioner, PartitionResult, cpu_compute
from .support import DontPartition, DontPartitionModule, DontPartitionName

__all__ = [
    "DelegationSpec",
    "NodePlacement",
    "Partitioner",
    "PartitionResult",
    "cpu_compute",
    "DontPartition",
    "DontPartitionModule",
    "DontPartitionName",
]
