"""Graph utilities every stage uses: the attribute a ``get_attr`` names, the state a graph updates, the user's
line behind a node, and the folding of what a graph computes from its constants alone."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import GraphModule

aten = torch.ops.aten


@dataclass
class State:
    """A buffer forward() updates (a running statistic, a KV cache): the program keeps it between calls, starting
    from ``initial`` (ExecuTorch's mutable buffer)."""

    name: str
    initial: torch.Tensor


STATE = "state"  # placeholder meta: the State a placeholder reads
FQN = "fqn"  # get_attr meta: the model's name of the parameter or buffer it reads (e.g. "conv.weight")
WRITES = "state_writes"  # output node meta: the state placeholders (names) the trailing outputs write, in order


def state_writes(graph: torch.fx.Graph) -> list[tuple[torch.fx.Node, object]]:
    """(state placeholder, new value) of each buffer the graph updates."""
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    names = out.meta.get(WRITES, [])
    if not names:
        return []
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    return list(zip((placeholders[n] for n in names), out.args[0][-len(names):]))


def with_state(graph: torch.fx.Graph, inputs) -> tuple:
    """Arguments for the graph's placeholders: the user's ``inputs`` in order, each state at its initial value (one
    call from the start, as a freshly loaded program makes it)."""
    given = iter(inputs)
    return tuple(n.meta[STATE].initial if STATE in n.meta else next(given)
                 for n in graph.nodes if n.op == "placeholder")


# A folded constant holds at most this many elements, or as many as its largest input (a weight computed from a
# weight): index arithmetic, rotary tables and weight transforms fold, a blown-up expand does not.
FOLD_LIMIT = 1 << 16


def source_of(node: torch.fx.Node) -> str | None:
    """'model.py:12', the user's line that created ``node``; for a model built of torch's own modules (an
    nn.Sequential) the module holding it instead, 'module features.3 (Conv2d)'; None when unknown."""
    stack = node.meta.get("stack_trace") or ""
    frames = [ln.strip()[5:] for ln in stack.splitlines() if ln.strip().startswith("File ")]
    own = [f for f in frames if "/site-packages/torch/" not in f]  # the user's line, not torch's module code
    if own:
        path, _, rest = own[-1].partition(", line ")
        return f"{path.strip(chr(34))}:{rest.split(',')[0]}"
    modules = list((node.meta.get("nn_module_stack") or {}).values())
    if modules and modules[-1][0]:
        path, kind = modules[-1]
        return f"module {path} ({str(kind).rsplit('.', 1)[-1]})"
    return None


def graph_attr(gm: GraphModule, node: torch.fx.Node | str):
    """The value a ``get_attr`` node (or its dotted target) names."""
    value = gm
    for part in (node if isinstance(node, str) else node.target).split("."):
        value = getattr(value, part)
    return value


def set_graph_attr(gm: torch.nn.Module, name: str, value: torch.Tensor) -> None:
    """Make the dotted attribute ``name`` (a buffer's place) ``value``."""
    owner, _, leaf = name.rpartition(".")
    setattr(gm.get_submodule(owner) if owner else gm, leaf, value)


def written_attrs(graph: torch.fx.Graph) -> set[str]:
    """The attributes an in-place op writes (a buffer forward() updates, as ``ep.module()`` has it): state, not
    constants."""
    return {n.args[0].target for n in graph.nodes if n.op == "call_function" and n.args
            and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
            and isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "get_attr"}


def own_state(gm: GraphModule) -> GraphModule:
    """``gm`` with copies of the state buffers it writes (``ep.module()`` shares them with the exported model):
    running it leaves the user's model as it was."""
    for name in written_attrs(gm.graph):
        set_graph_attr(gm, name, graph_attr(gm, name).clone())
    return gm


def _foldable(node: torch.fx.Node, state: set[str]) -> bool:
    val = node.meta.get("val")
    if not (node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
            and node.target.namespace == "aten" and not node.target._schema.is_mutable
            and not node.target.__name__.startswith(("rand", "normal", "bernoulli", "empty"))
            and isinstance(val, torch.Tensor)
            and all(n.op == "get_attr" and n.target not in state for n in node.all_input_nodes)):
        return False
    sizes = [n.meta["val"].numel() for n in node.all_input_nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    return val.numel() <= max([FOLD_LIMIT, *sizes])


def fold_constants(gm: GraphModule) -> GraphModule:
    """What the graph computes from its constants alone (positions from an arange, a rotary embedding's sin and cos
    tables, masks) becomes a constant: computed once here, as PyTorch computes it."""
    from torch.fx.node import map_arg

    state = written_attrs(gm.graph)
    for node in list(gm.graph.nodes):
        if not _foldable(node, state):
            continue
        value = node.target(*map_arg(node.args, lambda n: graph_attr(gm, n)),
                            **map_arg(node.kwargs, lambda n: graph_attr(gm, n)))
        name = f"_tosakit_folded_{node.name}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, value.contiguous())
        with gm.graph.inserting_before(node):
            const = gm.graph.get_attr(name)
        const.meta = {**node.meta, "val": value}
        node.replace_all_uses_with(const)
        gm.graph.erase_node(node)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
    return gm


# Arithmetic whose integer constant operand PyTorch promotes to the float result's dtype.
_PROMOTING = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.maximum.default,
              aten.minimum.default, aten.where.self}


def promote_constants(gm: GraphModule) -> GraphModule:
    """An integer constant in float arithmetic (YOLO anchors as an int tensor) becomes the float constant PyTorch's
    type promotion computes with, so it is quantized and lowered like any float operand."""
    changed = False
    for node in list(gm.graph.nodes):
        out = node.meta.get("val")
        if node.op != "call_function" or node.target not in _PROMOTING or not isinstance(out, torch.Tensor) \
                or not out.dtype.is_floating_point:
            continue
        for arg in node.args:
            val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) and arg.op == "get_attr" else None
            if isinstance(val, torch.Tensor) and not val.dtype.is_floating_point and val.dtype != torch.bool:
                value = graph_attr(gm, arg).to(out.dtype)
                name = f"_tosakit_promoted_{arg.name}"
                if not hasattr(gm, name):
                    gm.register_buffer(name, value)
                with gm.graph.inserting_before(node):
                    const = gm.graph.get_attr(name)
                const.meta = {**arg.meta, "val": value}
                node.replace_input_with(arg, const)
                changed = True
    if changed:  # most graphs have none: no code to regenerate
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm


def addmm_as_linear(gm: GraphModule) -> GraphModule:
    """addmm(bias, x, W) with constant W and 1-D bias and no scaling (transformers' GPT-2 Conv1D) becomes
    linear(x, W^T, bias): one layer that quantizes per channel and lowers as a convolution."""
    changed = False
    for node in [n for n in gm.graph.nodes if n.target == aten.addmm.default]:
        bias, x, weight = node.args[:3]
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1 or \
                any(not isinstance(a, torch.fx.Node) or a.op != "get_attr" for a in (bias, weight)) or \
                graph_attr(gm, bias).dim() != 1:
            continue
        name = "_t_" + weight.target.replace(".", "_")
        if not hasattr(gm, name):
            gm.register_buffer(name, graph_attr(gm, weight).detach().t().contiguous())
        with gm.graph.inserting_before(node):
            w_t = gm.graph.get_attr(name)
            linear = gm.graph.call_function(aten.linear.default, (x, w_t, bias))
        w_t.meta["val"] = getattr(gm, name)
        linear.meta = dict(node.meta)
        node.replace_all_uses_with(linear)
        gm.graph.erase_node(node)
        changed = True
    if changed:
        gm.graph.eliminate_dead_code()
        gm.recompile()
    return gm


def drop_identity_restrides(gm: GraphModule) -> GraphModule:
    """An as_strided that gives its input's values in their order (same size, no offset, the same strides on every
    dim longer than 1) is its input: decomposing an adaptive average pool of a channels-last tensor (torchvision's
    Swin, pooling after its permute) restrides the [N, C, 1, 1] mean so, and no backend lowers as_strided."""
    changed = False
    for node in [n for n in gm.graph.nodes if n.target == aten.as_strided.default]:
        x, size, stride = node.args[:3]
        offset = node.args[3] if len(node.args) > 3 else node.kwargs.get("storage_offset")
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or list(val.shape) != list(size) or offset not in (None, 0):
            continue
        if all(s == t for d, s, t in zip(size, stride, val.stride()) if d != 1):
            node.replace_all_uses_with(x)
            gm.graph.erase_node(node)
            changed = True
    if changed:
        gm.recompile()
    return gm


def vector_norm_args(node: torch.fx.Node) -> tuple[torch.fx.Node, float | None, list[int], bool]:
    """(x, order, dims, keepdim) of ``linalg_vector_norm``: dims sorted, every dim when none are named; the order
    None when a dtype conversion comes with it."""
    x, *rest = list(node.args) + [None] * (4 - len(node.args))
    order = node.kwargs.get("ord", rest[0] if rest[0] is not None else 2)
    dim, keep = node.kwargs.get("dim", rest[1]), node.kwargs.get("keepdim", rest[2] or False)
    rank = x.meta["val"].dim()
    dims = list(range(rank)) if dim is None or dim == [] else [dim] if isinstance(dim, int) else list(dim)
    dtype = node.kwargs.get("dtype", node.args[4] if len(node.args) > 4 else None)
    return x, None if dtype is not None else float(order), sorted({d % rank for d in dims}), bool(keep)
