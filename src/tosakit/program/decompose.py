"""CPU fallback runs only ExecuTorch kernels: ops without one are decomposed, as ExecuTorch's edge
lowering does, into ops that have one (hardswish -> add, clamp, mul, div)."""

from __future__ import annotations

import functools
import operator

import torch
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions, decomposition_table
from torch.fx import GraphModule, Node
from torch.fx.experimental.proxy_tensor import make_fx

from ..capture import source_of
from ..errors import REPORT_GRAPH_HINT, TosakitError, UnsupportedOpError, first_line
from ..partition import NodePlacement
from ..backends.cortex_m.scratch import scratch_buffer
from .emit import executorch_call_delegate, out_schema

# Rounds of decomposition one op may take before its pieces all have kernels.
MAX_DEPTH = 8


def has_kernel(target) -> bool:
    """Whether the ExecuTorch CPU runtime has an ``.out`` kernel for ``target``."""
    try:
        out_schema(target)
        return True
    except TosakitError:
        return False


@functools.lru_cache(maxsize=1)
def _core_aten() -> dict:
    return core_aten_decompositions()


def _decomposition(target):
    """The function that rewrites ``target`` into simpler ATen ops, or None."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    fn = _core_aten().get(target) or decomposition_table.get(target)
    if fn is None and torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd"):
        fn = target.decompose
    return fn


def _example(value):
    """A real tensor standing in for a node's fake value while tracing its decomposition."""
    return torch.zeros(value.shape, dtype=value.dtype) if isinstance(value, torch.Tensor) else value


def _trace(node: Node, fn) -> GraphModule:
    """``fn`` applied to ``node``'s arguments, traced to ATen (fake values, one op per node)."""
    leaves, spec = pytree.tree_flatten((node.args, node.kwargs))
    tensor_at = [i for i, a in enumerate(leaves) if isinstance(a, Node)]

    def call(*tensors):
        filled = list(leaves)
        for i, t in zip(tensor_at, tensors):
            filled[i] = t
        args, kwargs = pytree.tree_unflatten(filled, spec)
        out = fn(*args, **kwargs)
        return tuple(out) if isinstance(out, tuple) else out  # a plain tuple, not torch's named return type

    examples = [_example(leaves[i].meta["val"]) for i in tensor_at]
    with torch.no_grad():
        return make_fx(call, tracing_mode="fake")(*examples)


def _splice(gm: GraphModule, node: Node, traced: GraphModule) -> list[Node]:
    """Replace ``node`` by ``traced``'s graph; returns the new call nodes."""
    env: dict[Node, Node] = {}
    tensors = iter(a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, Node))
    new: list[Node] = []
    result = None
    with gm.graph.inserting_before(node):
        for n in traced.graph.nodes:
            if n.op == "placeholder":
                env[n] = next(tensors)
            elif n.op == "get_attr":
                name = f"_decomposed_{node.name}_{n.target}"
                gm.register_buffer(name, getattr(traced, n.target).clone())
                env[n] = gm.graph.get_attr(name)
                env[n].meta["val"] = getattr(gm, name)
            elif n.op == "output":
                result = pytree.tree_map(lambda a: env[a] if isinstance(a, Node) else a, n.args[0])
            else:
                env[n] = gm.graph.node_copy(n, lambda a: env[a])
                env[n].meta = {**node.meta, "val": n.meta.get("val")}
                new.append(env[n])
    if isinstance(result, (tuple, list)):
        for user in list(node.users):
            if user.target is not operator.getitem:
                raise TosakitError(f"node {node.name} ({node.target}) returns several values used as a whole",
                                   REPORT_GRAPH_HINT)
            user.replace_all_uses_with(result[user.args[1]])
            gm.graph.erase_node(user)
    else:
        node.replace_all_uses_with(result)
    gm.graph.erase_node(node)
    return new


def _refuse(node: Node, reason: str):
    where = source_of(node)
    raise UnsupportedOpError(
        f"node {node.name} ({node.target}){f' at {where}' if where else ''} stays on the CPU, but {reason}",
        "delegate it: pick a target that lowers it (see the report), or quantize with --quantize so the NPU "
        "can take it, or rewrite that line with operators the CPU runtime has")


# Kernels whose tensors must share one dim order (ExecuTorch's group norm: its 2-D mean and rstd are contiguous).
ONE_DIM_ORDER = {torch.ops.aten.native_group_norm.default}


def _contiguous_inputs(gm: GraphModule) -> None:
    """A channels-last input of a ``ONE_DIM_ORDER`` kernel is copied to contiguous first (its outputs are then
    contiguous too)."""
    for node in [n for n in gm.graph.nodes if n.target in ONE_DIM_ORDER]:
        x = node.args[0]
        val = x.meta.get("val") if isinstance(x, Node) else None
        if not isinstance(val, torch.Tensor) or val.is_contiguous():
            continue
        with gm.graph.inserting_before(node):
            copy = gm.graph.call_function(torch.ops.aten.clone.default, (x,),
                                          {"memory_format": torch.contiguous_format})
        copy.meta = {**x.meta, "val": val.contiguous()}
        node.replace_input_with(x, copy)
        node.meta["val"] = tuple(v.contiguous() for v in node.meta["val"])  # what the kernel writes, contiguous
        for item in node.users:
            item.meta["val"] = node.meta["val"][item.args[1]]
    gm.recompile()


def decompose_for_runtime(gm: GraphModule, placements: list[NodePlacement] | None = None) -> GraphModule:
    """Decompose every CPU op that has no ExecuTorch kernel; refuse one that neither has nor decomposes."""
    _contiguous_inputs(gm)
    pending = [(n, 0, n.name) for n in gm.graph.nodes if n.op == "call_function"
               and n.target not in (operator.getitem, executorch_call_delegate, scratch_buffer)
               and not has_kernel(n.target)]
    pieces: dict[str, list[str]] = {}
    while pending:
        node, depth, origin = pending.pop(0)
        fn = _decomposition(node.target)
        if fn is None or depth >= MAX_DEPTH:
            _refuse(node, "the ExecuTorch CPU runtime has no kernel for it and it does not decompose into ops "
                          "that have one")
        try:
            traced = _trace(node, fn)
        except Exception as exc:  # torch raises many kinds; the first line says why
            _refuse(node, f"decomposing it failed: {first_line(exc)}")
        for n in _splice(gm, node, traced):
            if has_kernel(n.target) or n.target is operator.getitem:
                pieces.setdefault(origin, []).append(str(n.target))
            else:
                pending.append((n, depth + 1, origin))
    if pieces:
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
        for p in placements or []:
            if p.node in pieces:
                ops = ", ".join(dict.fromkeys(t for t in pieces[p.node] if t != str(operator.getitem)))
                p.reason = f"{p.reason or 'on the CPU'}; runs as {ops} (no ExecuTorch kernel for {p.target})"
    return gm
