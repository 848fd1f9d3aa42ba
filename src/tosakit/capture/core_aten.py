"""A model captured with ``torch.export`` and brought to core ATen, its constants inlined as attributes: the
``CapturedProgram`` every later stage reads."""

from __future__ import annotations

import copy
import functools
import logging
import operator
import re
import traceback
import weakref
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind
from torch.fx import GraphModule
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from ..errors import TosakitError, first_line
from ..native import captured_output
from .graph import FQN, STATE, WRITES, State, addmm_as_linear, drop_identity_restrides

aten = torch.ops.aten

# Ops kept whole when decomposing to core ATen: lowering handles them better intact.
PRESERVED_OPS = (
    aten.linear.default,
    aten.hardtanh.default,
    aten.hardswish.default,
    aten.hardsigmoid.default,
    aten.silu.default,
    aten.upsample_nearest2d.vec,
    aten.upsample_bilinear2d.vec,
    aten.reflection_pad1d.default,  # else gathers with computed indices; whole, they are slices and concats
    aten.reflection_pad2d.default,
    aten.reflection_pad3d.default,
    aten.replication_pad1d.default,
    aten.replication_pad2d.default,
    aten.replication_pad3d.default,
)


@dataclass
class CapturedProgram:
    """A core-ATen graph with its constants inlined as attributes, plus pytree I/O specs."""

    graph_module: GraphModule
    in_spec: object
    out_spec: object
    name: str = "forward"

    @property
    def graph(self):
        return self.graph_module.graph

    def __str__(self) -> str:
        return str(self.graph_module.graph)


def baked(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its weight parametrizations (2:4 pruning, clustering: ``quantize.transforms``) applied to a
    copy's weights, which export then captures as constants; ``model`` itself when it has none. (The copy's layers
    return to their own class one by one: torch's remove_parametrizations would also strip the parametrized class
    the copy shares with ``model``.)"""
    from torch.nn.utils import parametrize

    if not any(parametrize.is_parametrized(m) for m in model.modules()):
        return model
    import copy

    model = copy.deepcopy(model)
    for module in list(model.modules()):
        if parametrize.is_parametrized(module):
            values = {name: getattr(module, name).detach().clone() for name in module.parametrizations}
            del module._modules["parametrizations"]
            module.__class__ = type(module).__bases__[0]
            for name, value in values.items():
                module.register_parameter(name, torch.nn.Parameter(value, requires_grad=False))
    return model


def export(model: torch.nn.Module, example_inputs: tuple, dynamic_shapes=None) -> ExportedProgram:
    """``torch.export.export`` with a clear error when the model cannot be captured (weight parametrizations
    baked in, see ``baked``)."""
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    model = baked(model)
    logging.disable(logging.WARNING)  # torch logs and prints generated code as export fails
    try:
        with captured_output((1, 2)):
            return torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as exc:  # torch raises many kinds; the first line names the problem
        integer = re.search(r"scalar types?:? ?(Long|Int)|expected scalar type (Long|Int)", str(exc))
        raise TosakitError(
            f"torch.export could not capture {type(model).__name__}{_user_frame(exc)}: {first_line(exc, 1000)}",
            "the model indexes with an input (token ids): give it integer example inputs (on the command line "
            "--input-shape SHAPE:int64:LOW..HIGH, e.g. 1,32:int64:0..30521)" if integer else
            "make forward() traceable: no Python control flow on tensor values (use torch.where / torch.cond), "
            "no unsupported Python objects; see https://pytorch.org/docs/stable/export.html",
        ) from exc
    finally:
        logging.disable(logging.NOTSET)


def _user_frame(exc: BaseException) -> str:
    """' (at file.py:12: <code>)' for the user's line that torch blames, when it says which."""
    match = re.search(r'File "([^"]+)", line (\d+), in \w+\n\s*(.+)', str(exc))
    if match:
        return f" (at {match.group(1)}:{match.group(2)}: {match.group(3).strip()})"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/torch/" not in f.filename
              and "/tosakit/" not in f.filename]
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


@functools.lru_cache(maxsize=8)
def _core_table(preserve: tuple, registered: int) -> dict:
    table = torch.export.default_decompositions()
    for op in preserve:
        table.pop(op, None)
    return dict(table.items())


def decomposition_table(preserve=PRESERVED_OPS) -> dict:
    """Core ATen decompositions, minus the ops lowering wants whole: built once per set of registered operators
    (torch's own table collects every composite operator again on each lookup, a tenth of a second a time)."""
    return dict(_core_table(tuple(preserve), len(torch._C._dispatch_get_all_op_names())))


def to_core_aten(ep: ExportedProgram, preserve=PRESERVED_OPS) -> ExportedProgram:
    """Decompose to core ATen, keeping ``preserve`` ops whole."""
    try:
        return ep.run_decompositions(decomposition_table(preserve))
    except Exception as exc:
        raise TosakitError(
            f"decomposing the exported program to core ATen failed: {first_line(exc, 1000)}",
            "export the model with torch.export.export(model, example_inputs) and pass that ExportedProgram",
        ) from exc


def _schema_args(node: torch.fx.Node) -> list:
    """A call's arguments in schema order, defaults filled in."""
    schema = node.target._schema
    return [node.args[i] if i < len(node.args) else node.kwargs.get(a.name, a.default_value)
            for i, a in enumerate(schema.arguments)]


def _conv(node):
    x, w, b, stride, padding, dilation, groups = _schema_args(node)
    if isinstance(padding, str):
        return None
    return aten.convolution.default, (x, w, b, stride, padding, dilation, False, [0] * len(stride), groups)


def _functional(op):
    """An in-place activation whose input nobody else reads, as its functional twin."""
    def rewrite(node):
        return (op, tuple(_schema_args(node))) if len(node.args[0].users) == 1 else None
    return rewrite


def _relu6(node):
    """relu6 is hardtanh(0, 6); the in-place form only when nobody else reads its input."""
    in_place = node.target is aten.relu6_.default
    return None if in_place and len(node.args[0].users) > 1 else (aten.hardtanh.default, (node.args[0], 0, 6))


def _dropout(node):
    x, _, train = _schema_args(node)
    return None if train else (aten.clone.default, (x,))


def _flatten(node):
    shape = node.meta["val"].shape
    return (aten.view.default, (node.args[0], list(shape))) if all(isinstance(d, int) for d in shape) else None


def _global_average_pool(node):
    x, size = _schema_args(node)
    return (aten.mean.dim, (x, [-1, -2], True)) if list(size) == [1, 1] else None


# What run_decompositions would make of the commonest non-core ops, rewritten in place (no re-trace).
_DIRECT = {
    aten.conv1d.default: _conv,
    aten.conv2d.default: _conv,
    aten.hardtanh_.default: _functional(aten.hardtanh.default),
    aten.relu_.default: _functional(aten.relu.default),
    aten.relu6.default: _relu6,
    aten.relu6_.default: _relu6,
    aten.dropout.default: _dropout,
    aten.flatten.using_ints: _flatten,
    aten.adaptive_avg_pool2d.default: _global_average_pool,
}


def _decomposed(target, table: dict, preserve) -> bool:
    """Whether run_decompositions would rewrite calls of ``target`` (in-place ops it makes functional)."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    if target._schema.is_mutable:
        return True
    return target not in preserve and (
        target in table or torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd"))


def _stack(node, emit):
    """torch's own decomposition of stack (``torch._refs.stack``): one cat and a view, or (stacking along a
    new last axis) an unsqueeze of each tensor and a cat; a default argument (dim 0) is left out, as tracing
    records it."""
    tensors, dim = _schema_args(node)
    if not isinstance(tensors[0].meta.get("val"), torch.Tensor):
        raise _NoFakeValue
    ndim = tensors[0].meta["val"].dim()
    wrapped = dim + ndim + 1 if dim < 0 else dim
    if wrapped < ndim:
        cat = emit(aten.cat.default, (list(tensors), wrapped) if wrapped else (list(tensors),))
        shape = list(tensors[0].meta["val"].shape)
        shape.insert(wrapped, len(tensors))
        return emit(aten.view.default, (cat, shape))
    parts = [emit(aten.unsqueeze.default, (t, wrapped)) for t in tensors]
    return emit(aten.cat.default, (parts, dim) if dim else (parts,))


def _max_pool2d(node, emit):
    """max_pool2d is max_pool2d_with_indices (the same arguments) and the first of its results; tracing also
    takes the second (the indices), which nothing reads: its name is used up all the same."""
    pool = emit(aten.max_pool2d_with_indices.default, node.args)
    return emit(operator.getitem, (pool, 0), 1)


# Non-core ops whose decomposition is several nodes (or takes a new node's name): built from torch's own rule,
# each new node's value computed in the program's fake mode; the graph's names are then given again in order,
# as a re-trace gives them.
_DIRECT_MANY = {
    aten.stack.default: _stack,
    aten.max_pool2d.default: _max_pool2d,
}


def _trace_name_of(target) -> str | None:
    """The name tracing gives a call of ``target`` (before a number makes it unique)."""
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    return "getitem" if target is operator.getitem else None


def _trace_name(node: torch.fx.Node) -> str:
    return (_trace_name_of(node.target) if node.op == "call_function" else None) or node.name


def _traced_names(graph: torch.fx.Graph) -> list[str]:
    """The names a trace gives ``graph``'s nodes, in order."""
    names = torch.fx.graph._Namespace()
    return [names.create_name(_trace_name(n), None) for n in graph.nodes]


def _named_as_traced(gm: GraphModule, unnamed_after: dict) -> GraphModule:
    """``gm`` with its nodes named as tracing it would name them; ``unnamed_after[node]`` names were used up
    after ``node`` by values nothing reads."""
    graph, env = torch.fx.Graph(), {}
    for n in gm.graph.nodes:
        env[n] = graph.create_node(n.op, n.target, torch.fx.node.map_arg(n.args, env.__getitem__),
                                   torch.fx.node.map_arg(n.kwargs, env.__getitem__), _trace_name(n), n.type)
        env[n].meta = n.meta
        for _ in range(unnamed_after.get(n, 0)):
            graph._graph_namespace.create_name(_trace_name(n), None)
    return GraphModule(gm, graph)


def direct_core_aten(ep: ExportedProgram, preserve=PRESERVED_OPS) -> GraphModule | None:
    """The core-ATen graph by rewriting a few ops in a copy of the graph, when that is all decomposing
    would do (ordinary CNNs, and recurrences' stacks: seconds faster than re-tracing); None when a full
    decomposition is needed (as it is for a graph writing a buffer in place: decomposing makes the write an
    output that the graph signature names)."""
    buffers = {s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.BUFFER}
    if any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
           and n.args and getattr(n.args[0], "name", None) in buffers for n in ep.graph.nodes):
        return None
    table = decomposition_table(preserve)
    graph = torch.fx.Graph()
    out = graph.graph_copy(ep.graph, {})
    graph.output(out)
    unnamed_after: dict = {}
    renamed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or not _decomposed(node.target, table, preserve):
            continue
        rewrite = _DIRECT.get(node.target)
        many = _DIRECT_MANY.get(node.target)
        new = rewrite(node) if rewrite else None
        if new is None and many is None:
            return None
        if many is not None:
            if not renamed and _traced_names(ep.graph) != [n.name for n in ep.graph.nodes]:
                return None  # names a re-trace would not keep: only a re-trace gives them
            renamed = True

            def emit(target, args, unnamed_after_this=0, node=node):
                with graph.inserting_before(node):
                    made = graph.create_node("call_function", target, tuple(args), name=_trace_name_of(target))
                made.meta = {k: v for k, v in node.meta.items() if k not in ("val", "tensor_meta")}
                made.meta["val"] = _fake_value(target, made.args)
                if isinstance(made.meta["val"], torch.Tensor):
                    made.meta["tensor_meta"] = _extract_tensor_metadata(made.meta["val"])
                if unnamed_after_this:
                    unnamed_after[made] = unnamed_after_this
                return made

            try:
                call = many(node, emit)
            except _NoFakeValue:
                return None  # values this path cannot compute: the re-trace computes them
        else:
            with graph.inserting_before(node):
                call = graph.create_node("call_function", new[0], tuple(new[1]), name=new[0]._opname)  # as decomposing names it
            call.meta = dict(node.meta)
        node.replace_all_uses_with(call)
        graph.erase_node(node)
    gm = GraphModule(ep.graph_module, graph)
    return _named_as_traced(gm, unnamed_after) if renamed else gm


class _NoFakeValue(Exception):
    """A new node's value cannot be computed from its inputs' (a graph without fake values)."""


def _fake_value(target, args):
    """A new node's value: ``target`` run on its inputs' fake values, in their fake mode."""
    from torch._guards import detect_fake_mode
    from torch.fx.node import map_arg

    inputs: list[torch.fx.Node] = []
    map_arg(args, inputs.append)
    if any("val" not in n.meta for n in inputs):
        raise _NoFakeValue
    values = map_arg(args, lambda n: n.meta["val"])
    if target is operator.getitem:
        return values[0][values[1]]
    mode = detect_fake_mode(torch.utils._pytree.tree_leaves(values))
    if mode is None:
        raise _NoFakeValue
    with mode:
        return target(*values)


def inline_constants(ep: ExportedProgram, gm: GraphModule | None = None) -> CapturedProgram:
    """Turn lifted parameters, buffers and constants into ``get_attr`` nodes (in ``gm``, a core-ATen copy
    of ``ep``'s graph, when given)."""
    gm = gm if gm is not None else ep.graph_module
    graph = gm.graph
    values = {**ep.state_dict, **ep.constants}
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
    mutated = set(ep.graph_signature.buffers_to_mutate.values())
    for node in list(graph.nodes):
        if node.op != "placeholder":
            continue
        spec = specs.get(node.name)
        if spec is None or spec.kind == InputKind.USER_INPUT:
            continue
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            raise TosakitError(
                f"input {node.name!r} of kind {spec.kind.name} is not supported",
                "export the model in eval mode without mutable state or custom objects",
            )
        if spec.kind == InputKind.BUFFER and spec.target in mutated:
            node.meta[STATE] = State(spec.target, values[spec.target].detach().clone())
            continue
        if not node.users:
            graph.erase_node(node)
            continue
        attr = "_c_" + node.name
        value = values[spec.target]
        value = value.detach() if isinstance(value, torch.nn.Parameter) else value
        gm.register_buffer(attr, value.clone())
        with graph.inserting_before(node):
            get = graph.get_attr(attr)
        get.meta = {**node.meta, FQN: spec.target}
        node.replace_all_uses_with(get)
        graph.erase_node(node)
    _move_get_attrs_after_placeholders(graph)
    graph.lint()
    gm.recompile()
    return CapturedProgram(gm, ep.call_spec.in_spec, ep.call_spec.out_spec)


def user_outputs_only(ep: ExportedProgram, gm: GraphModule) -> None:
    """The graph returns the model's outputs, then each updated buffer's new value (``state_writes``): an
    in-place update of an input (``nn.SiLU(inplace=True)`` applied to it) is not written back, as the program's
    caller never sees it."""
    kinds = [s.kind for s in ep.graph_signature.output_specs]
    if all(k == OutputKind.USER_OUTPUT for k in kinds):
        return
    state = {n.meta[STATE].name: n.name for n in gm.graph.nodes if n.op == "placeholder" and STATE in n.meta}
    out = next(n for n in gm.graph.nodes if n.op == "output")
    values = [v for v, k in zip(out.args[0], kinds) if k == OutputKind.USER_OUTPUT]
    writes = [(v, state[s.target]) for v, s in zip(out.args[0], ep.graph_signature.output_specs)
              if s.kind == OutputKind.BUFFER_MUTATION]
    out.args = (tuple(values + [v for v, _ in writes]),)
    out.meta[WRITES] = [name for _, name in writes]
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _move_get_attrs_after_placeholders(graph) -> None:
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if placeholders:
        anchor = placeholders[-1]
        for n in [n for n in graph.nodes if n.op == "get_attr"]:
            anchor.append(n)
            anchor = n


_DECOMPOSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # exported program -> (preserve, core ATen)


def _decomposed_once(ep: ExportedProgram, preserve) -> tuple[ExportedProgram, GraphModule]:
    """``ep`` in core ATen and a fresh copy of its graph: decomposed once per exported program (a third of a
    second each time an export was compiled for another target)."""
    cached = _DECOMPOSED.get(ep)
    if cached is None or cached[0] != tuple(preserve):
        cached = _DECOMPOSED[ep] = (tuple(preserve), to_core_aten(ep, preserve))
    return cached[1], copy.deepcopy(cached[1].graph_module)


def capture(ep: ExportedProgram, preserve=PRESERVED_OPS) -> CapturedProgram:
    """Core ATen, constants inlined: the form every later stage reads."""
    if not isinstance(ep, ExportedProgram):
        raise TosakitError(
            f"expected a torch.export.ExportedProgram, got {type(ep).__name__}",
            "call torch.export.export(model, example_inputs) first and pass its result",
        )
    direct = direct_core_aten(ep, preserve)
    if direct is None:
        ep, direct = _decomposed_once(ep, preserve)
    captured = inline_constants(ep, direct)
    user_outputs_only(ep, captured.graph_module)
    addmm_as_linear(captured.graph_module)
    drop_identity_restrides(captured.graph_module)
    return captured

