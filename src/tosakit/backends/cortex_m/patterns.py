"""What the Cortex-M passes share: finding a quantized pattern (dequantize -> op [-> relu/clamp] -> quantize) and
putting one ``cortex_m::`` call in its place."""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ...capture.graph import graph_attr
from ...partition.partitioner import ABSORBS
from ...quantize.qdq import QParams, is_dequantize, is_quantize, qparams_of
from .ops import multiplier_shift
from .scratch import scratch_buffer

aten = torch.ops.aten
cm = torch.ops.cortex_m
INT8 = (torch.int8, -128, 127)
REPLACES = "cortex_m_replaces"  # a kernel node's meta: the quantize node whose value it computes

# Activations a kernel's output bounds absorb: (low, high) in real numbers from the node's arguments.
ACTIVATIONS: dict = {aten.relu.default: lambda n: (0.0, None), aten.hardtanh.default: lambda n: (n.args[1], n.args[2]),
                     aten.clamp.default: lambda n: (n.args[1], n.args[2] if len(n.args) > 2 else None)}


def int8_tensor(node) -> QParams | None:
    """Per-tensor int8 qparams of a quantize/dequantize node, else None."""
    if not (is_quantize(node) or is_dequantize(node)) or node.target not in (
            torch.ops.quantized_decomposed.quantize_per_tensor.default,
            torch.ops.quantized_decomposed.dequantize_per_tensor.default):
        return None
    q = qparams_of(node)
    return q if (q.dtype, q.qmin, q.qmax) == INT8 else None


def pattern_output(node: Node) -> tuple[Node, QParams, int, int] | None:
    """The quantize that ends ``node``'s pattern (through one absorbed activation), its qparams and the int8
    bounds the activation leaves."""
    users = list(node.users)
    if len(users) != 1:
        return None
    bounds = (None, None)
    if users[0].target in ACTIVATIONS and len(users[0].users) == 1:
        bounds, users = ACTIVATIONS[users[0].target](users[0]), list(users[0].users)
    q = int8_tensor(users[0])
    if q is None or not isinstance(bounds[0], (int, float, type(None))):
        return None
    low, high = q.qmin, q.qmax
    if bounds[0] is not None:
        low = max(low, int(q.quantize(torch.tensor(float(bounds[0])))))
    if bounds[1] is not None:
        high = min(high, int(q.quantize(torch.tensor(float(bounds[1])))))
    return users[0], q, low, high


def pattern_input(node) -> tuple[Node, QParams] | None:
    """The int8 tensor a per-tensor dequantize reads, and its qparams."""
    q = int8_tensor(node) if isinstance(node, Node) and is_dequantize(node) else None
    return (node.args[0], q) if q is not None else None


def dequantized_constant(gm: GraphModule, dq: Node) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(integer values, scales, zero points) of a dequantized constant (per-tensor or per-channel)."""
    if not (isinstance(dq, Node) and is_dequantize(dq) and dq.args[0].op == "get_attr"):
        return None
    q = qparams_of(dq, gm)
    return (graph_attr(gm, dq.args[0]), torch.as_tensor(q.scale, dtype=torch.float64).reshape(-1),
            torch.as_tensor(q.zero_point).reshape(-1))


def new_constant(gm: GraphModule, name: str, value: torch.Tensor, before: Node) -> Node:
    """A new constant, read by a get_attr placed before ``before``."""
    gm.register_buffer(name, value.contiguous())
    with gm.graph.inserting_before(before):
        node = gm.graph.get_attr(name)
    node.meta["val"] = value
    return node


def replace_pattern(gm: GraphModule, output: Node, target, args: tuple) -> Node:
    """``target(*args)`` in place of the pattern ending at quantize ``output``; its meta names the nodes it
    computes (those only the pattern read)."""
    with gm.graph.inserting_before(output):
        node = gm.graph.call_function(target, args)
    node.meta = {**output.meta, REPLACES: output.meta.get(REPLACES, output.name)}
    output.replace_all_uses_with(node)
    node.meta[ABSORBS] = _absorbed(output)
    return node


def _absorbed(output: Node) -> list[str]:
    """``output`` and the nodes before it whose every reader is among them: what the replaced pattern computed."""
    inside, stack = {output}, list(output.all_input_nodes)
    while stack:
        n = stack.pop()
        if n not in inside and n.op == "call_function" and n.users and all(u in inside for u in n.users):
            inside.add(n)
            stack += n.all_input_nodes
    names = [n.name for n in inside]
    for n in inside:
        names += n.meta.get(ABSORBS, [])
    return list(dict.fromkeys(names))


def scratch(gm: GraphModule, size: int, before: Node) -> Node:
    with gm.graph.inserting_before(before):
        node = gm.graph.call_function(scratch_buffer, (size,))
    node.meta["val"] = torch.empty(size, dtype=torch.uint8)
    return node


def per_channel_requantize(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [multiplier_shift(float(s)) for s in scales]
    return (torch.tensor([m for m, _ in pairs], dtype=torch.int32),
            torch.tensor([s for _, s in pairs], dtype=torch.int32))


def same_qparams(a: QParams, b: QParams) -> bool:
    return (a.s, a.zp) == (b.s, b.zp)


def clean(gm: GraphModule) -> GraphModule:
    """Drop what the replaced patterns left unread."""
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm
