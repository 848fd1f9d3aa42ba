"""Extra operator checks users pass as ``additional_checks`` (torch ``OperatorSupportBase``)."""

from __future__ import annotations

from torch.fx import Node
from torch.fx.passes.operator_support import OperatorSupportBase


class RefusingCheck(OperatorSupportBase):
    """An ``OperatorSupportBase`` that can say why it refused a node."""

    def is_node_supported(self, submodules, node: Node) -> bool:
        return self.reason(node) is None

    def reason(self, node: Node) -> str | None:
        raise NotImplementedError


class DontPartition(RefusingCheck):
    """Keep these ops on the CPU: ``DontPartition(torch.ops.aten.add.Tensor, "aten.sigmoid.default")``."""

    def __init__(self, *targets):
        self.targets = {t if isinstance(t, str) else str(t) for t in targets}

    def reason(self, node: Node) -> str | None:
        names = {str(node.target), str(getattr(node.target, "overloadpacket", node.target))}
        return "excluded by DontPartition" if self.targets & names else None


class DontPartitionName(RefusingCheck):
    """Keep nodes whose name contains any of these strings on the CPU."""

    def __init__(self, *names: str):
        self.names = names

    def reason(self, node: Node) -> str | None:
        hit = next((n for n in self.names if n in node.name), None)
        return f"excluded by DontPartitionName({hit!r})" if hit else None


class DontPartitionModule(RefusingCheck):
    """Keep nodes from modules of a type (``module_name``) or with an instance name on the CPU."""

    def __init__(self, module_name: str | None = None, instance_name: str | None = None):
        self.module_name = module_name
        self.instance_name = instance_name

    def reason(self, node: Node) -> str | None:
        for fqn, mtype in (node.meta.get("nn_module_stack") or {}).values():
            type_name = mtype if isinstance(mtype, str) else f"{mtype.__module__}.{mtype.__qualname__}"
            if self.module_name and (type_name == self.module_name or type_name.endswith("." + self.module_name)):
                return f"excluded by DontPartitionModule(module_name={self.module_name!r})"
            if self.instance_name and (fqn == self.instance_name or fqn.endswith("." + self.instance_name)):
                return f"excluded by DontPartitionModule(instance_name={self.instance_name!r})"
        return None


def refusal(check: OperatorSupportBase, node: Node) -> str | None:
    """Why a user check refused ``node`` (None if it accepts it)."""
    if isinstance(check, RefusingCheck):
        return check.reason(node)
    if check.is_node_supported({}, node):
        return None
    return f"excluded by {type(check).__name__}"
