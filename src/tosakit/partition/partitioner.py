"""Capability-based partitioning with reasons: every node ends up placed, and explained."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from ..capture import graph_attr, source_of
from ..quantize.qdq import fused_activation_of, is_dequantize, is_quantize
from ..specs import CompileSpec
from .support import refusal

TAG_KEY = "delegation_tag"
# Why quantize/dequantize at a delegate's edge stay on the CPU (shown in reports).
BOUNDARY_Q = "quantizes a float input for the delegate (stays on the CPU)"
BOUNDARY_DQ = "dequantizes a delegate output back to float (stays on the CPU)"
BOUNDARY_IDS = ("casts ids between the model's int64 and the int32 a delegate takes (stays on the CPU; TOSA has no "
                "int64)")
IDS_CAST = "tosakit_ids_cast"  # node meta: a cast of ids between int64 and int32 (a boundary conversion)
ABSORBS = "cpu_kernel_absorbs"  # node meta: the names of the nodes one CPU kernel call computes (its pattern)
SupportFn = Callable[[Node], "str | None"]


@dataclass(frozen=True)
class DelegationSpec:
    """Which backend a partition goes to, and the compile specs stored with it."""

    backend_id: str
    compile_specs: list[CompileSpec]


@dataclass
class NodePlacement:
    """Where one graph node runs: a delegate tag, or the CPU with the reason."""

    node: str
    target: str
    placement: str  # "delegate" or "cpu"
    tag: str | None = None
    reason: str | None = None
    source: str | None = None
    kernel: str | None = None  # on the CPU, after its passes: the kernel call that computes it

    @property
    def compute(self) -> bool:
        """Whether the op computes: not a quantize, dequantize or ids cast converting at a delegate's edge."""
        return "quantize" not in self.target and self.reason != BOUNDARY_IDS


def note_cpu_kernels(gm: GraphModule, placements: list[NodePlacement]) -> list[NodePlacement]:
    """After the CPU passes: the kernel call that computes each CPU placement (a pattern's kernel, the node
    retargeted to one, or a portable kernel)."""
    kernels = {n.name: n for n in gm.graph.nodes if n.op == "call_function"}
    absorbed = {name: n for n in kernels.values() for name in n.meta.get(ABSORBS, ())}
    for p in placements:
        kernel = absorbed.get(p.node) or kernels.get(p.node)
        if p.placement == "cpu" and kernel is not None:
            target, own = str(kernel.target), "" if kernel.name == p.node else f" ({kernel.name})"
            p.kernel = f"cortex_m::{target.split('.')[1]}{own}" if target.startswith("cortex_m.") else \
                f"portable {kernel.name}"
    return placements


def cpu_compute(placements: list[NodePlacement]) -> list[NodePlacement]:
    """The computing ops left on the CPU."""
    return [p for p in placements if p.placement == "cpu" and p.compute]


@dataclass
class PartitionResult:
    """The tagged graph, the delegation spec per tag, and the placement of every op."""

    graph_module: GraphModule
    partition_tags: dict[str, DelegationSpec]
    placements: list[NodePlacement] = field(default_factory=list)
    # work a backend already did while validating a partition (lowering, compiling), reused later
    prepared: dict[str, object] = field(default_factory=dict)


class _Supported(OperatorSupportBase):
    def __init__(self, nodes: set[Node]):
        self.nodes = nodes

    def is_node_supported(self, submodules, node: Node) -> bool:
        return node in self.nodes


def _is_float(node: Node) -> bool:
    val = node.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dtype.is_floating_point


def _computes(node: Node) -> bool:
    return not (is_quantize(node) or is_dequantize(node) or node.target is operator.getitem)


class Partitioner:
    """Tags the largest supported subgraphs for one backend and explains the rest."""

    def __init__(self, delegation_spec: DelegationSpec, support: SupportFn, integer_io_only: bool,
                 additional_checks: Sequence[OperatorSupportBase] | None = None):
        self.delegation_spec = delegation_spec
        self.support = support
        self.integer_io_only = integer_io_only
        self.additional_checks = list(additional_checks or [])

    def reason(self, node: Node) -> str | None:
        """Why ``node`` cannot be delegated (None if it can)."""
        for check in self.additional_checks:
            why = refusal(check, node)
            if why:
                return why
        return self.support(node)

    def partition_graph(self, gm: GraphModule) -> PartitionResult:
        """Tag ``gm`` in place; return the tags and a placement for every op."""
        for node in gm.graph.nodes:
            node.meta.pop(TAG_KEY, None)
        reasons: dict[Node, str] = {}
        supported = set()
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            why = self.reason(node)
            if why is None:
                supported.add(node)
            else:
                reasons[node] = why
        groups = self._propose(gm, supported)
        groups = [self._trim(g, reasons) for g in groups]
        groups = self._propose(gm, set().union(*groups)) if groups else []
        tags: dict[str, DelegationSpec] = {}
        for group in groups:
            if not any(_computes(n) for n in group):
                for n in group:
                    reasons[n] = "nothing but quantize/dequantize: not worth a delegate"
                continue
            tag = f"tag{len(tags)}"
            tags[tag] = self.delegation_spec
            for n in group:
                n.meta[TAG_KEY] = tag
        return PartitionResult(gm, tags, self._placements(gm, reasons))

    def _propose(self, gm: GraphModule, nodes: set[Node]) -> list[set[Node]]:
        if not nodes:
            return []
        cbp = CapabilityBasedPartitioner(gm, _Supported(nodes), allows_single_node_partition=True)
        return [set(p.nodes) for p in cbp.propose_partitions()]

    def _trim(self, group: set[Node], reasons: dict[Node, str]) -> set[Node]:
        """Leave boundary quantize/dequantize (and, for integer-only targets, any float I/O) to the CPU."""
        changed = True
        while changed:
            changed = False
            for n in list(group):
                why = None
                if is_quantize(n) and n.args[0] not in group:
                    why = BOUNDARY_Q
                elif is_dequantize(n) and not any(u in group for u in n.users):
                    why = BOUNDARY_DQ
                elif self.integer_io_only and _is_float(n) and any(u not in group for u in n.users):
                    why = "its float output would leave an integer-only delegate"
                elif self.integer_io_only and any(_is_float(a) and a.op == "placeholder" or
                                                  (_is_float(a) and a.op == "call_function" and a not in group)
                                                  for a in n.all_input_nodes):
                    producer = n.all_input_nodes[0]
                    why = (f"runs fused with {producer.name}, which stays on the CPU"
                           if fused_activation_of(producer) is n else
                           "its float input would enter an integer-only delegate")
                if why:
                    group.discard(n)
                    reasons[n] = why
                    changed = True
        return group

    def _placements(self, gm: GraphModule, reasons: dict[Node, str]) -> list[NodePlacement]:
        out = []
        for n in gm.graph.nodes:
            if n.op != "call_function" or n.target is operator.getitem:
                continue
            tag = n.meta.get(TAG_KEY)
            out.append(NodePlacement(n.name, str(n.target), "delegate" if tag else "cpu", tag,
                                     None if tag else reasons.get(n, "not part of any delegate"), source_of(n)))
        return out


@dataclass
class Subgraph:
    """One tagged partition as a standalone graph, with the outer values it reads and writes."""

    graph_module: GraphModule
    inputs: list[Node]  # outer nodes feeding the partition, in placeholder order
    outputs: list[Node]  # outer (tagged) nodes whose values leave the partition, in output order
    constants: list[Node]  # outer get_attr nodes the partition copies (erased outside once nothing else reads them)


def extract_subgraph(gm: GraphModule, tag: str) -> Subgraph:
    """Copy the nodes tagged ``tag`` into a new GraphModule (constants copied as attributes, also those other
    nodes read too: a quantization parameter a CPU op shares stays a constant, never a delegate input)."""
    members = [n for n in gm.graph.nodes if n.meta.get(TAG_KEY) == tag]
    member_set = set(members)
    outer = list(dict.fromkeys(a for n in members for a in n.all_input_nodes if a not in member_set))
    owned = [a for a in outer if a.op == "get_attr"]
    inputs = [a for a in outer if a not in owned]
    graph = torch.fx.Graph()
    sub = torch.nn.Module()
    env: dict[Node, Node] = {}
    for a in inputs:
        env[a] = graph.placeholder(a.name)
    for a in owned:
        env[a] = graph.get_attr(a.target)
        _copy_attr(gm, sub, a.target)
    for a in outer:
        env[a].meta = dict(a.meta)
    for n in members:
        env[n] = graph.node_copy(n, lambda a: env[a])
    outputs = [n for n in members if any(u not in member_set for u in n.users)]
    graph.output(tuple(env[n] for n in outputs))
    return Subgraph(GraphModule(sub, graph), inputs, outputs, owned)


def _copy_attr(src: torch.nn.Module, dst: torch.nn.Module, target: str) -> None:
    value = graph_attr(src, target)
    *path, leaf = target.split(".")
    mod = dst
    for part in path:
        if not hasattr(mod, part):
            mod.add_module(part, torch.nn.Module())
        mod = getattr(mod, part)
    mod.register_buffer(leaf, value)
