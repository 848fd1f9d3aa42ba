"""The rewrites that prepare a graph for annotation, run in order from ``annotation_pipeline``: in-place ops
functional, constants folded, composite layers decomposed, number operands made constant tensors, so each op the
rules meet gets its own quantization."""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from ..capture import addmm_as_linear, fold_constants, promote_constants
from .annotate import is_float_tensor, training_batch_norm, unary
from .config import QuantizationConfig
from .decompose import DECOMPOSE_FOR_ANNOTATION, Builder

aten = torch.ops.aten


def _without_batch_norm_counters(model: GraphModule) -> GraphModule:
    """Batch norm's training counter (``num_batches_tracked += 1``, which no op reads) left out: quantized for
    inference, it would be state updated on the CPU at every call."""
    for node in list(model.graph.nodes):
        if node.op == "call_function" and node.target in (aten.add_.Tensor, aten.add.Tensor) and not node.users \
                and isinstance(node.args[0], Node) and node.args[0].op == "get_attr" \
                and node.args[0].target.split(".")[-1] == "num_batches_tracked":
            model.graph.erase_node(node)
    model.recompile()
    return model


def _bias_before_batch_norm(model: GraphModule) -> GraphModule:
    """A convolution without bias that feeds a batch norm being trained gets a zero bias, an int32 input like any
    other: torchao folds the batch norm's shift into it at convert."""
    for node in list(model.graph.nodes):
        if node.op != "call_function" or training_batch_norm(node) is None or \
                (len(node.args) > 2 and node.args[2] is not None):
            continue
        w = node.args[1].meta["val"]
        name = f"{node.name}_bias"
        model.register_parameter(name, torch.nn.Parameter(torch.zeros(w.shape[0], dtype=w.dtype)))
        with model.graph.inserting_before(node):
            bias = model.graph.get_attr(name)
        bias.meta["val"] = torch.zeros(w.shape[0], dtype=w.dtype)
        node.args = (node.args[0], node.args[1], bias, *node.args[3:])
    model.recompile()
    return model


def _functional(model: GraphModule) -> GraphModule:
    """In-place ops (``masked_fill_`` on the ``zeros_like`` attention builds its mask from) as their functional form,
    later readers of the tensor they wrote reading the result: a tensor made in the graph, then folded to a
    constant, is not a buffer the program updates. A module's buffer written in place (state, a KV cache's
    ``index_put_``) gets its last value written back at the end, ``copy_(buffer, value)``, as ``ep.module()``
    writes back a functionalized update."""
    graph = model.graph
    order = {node: i for i, node in enumerate(graph.nodes)}
    state_of, latest = {}, {}  # value -> the buffer it is a version of; buffer -> its last version
    for node in list(graph.nodes):
        packet = getattr(node.target, "overloadpacket", None) if node.op == "call_function" else None
        name = getattr(packet, "__name__", "")
        functional = getattr(getattr(aten, name[:-1], None), node.target._overloadname, None) if name.endswith("_") \
            and not name.startswith("_") else None
        if functional is None or not node.args or not isinstance(node.args[0], Node) or \
                (node.target is aten.copy_.default and node.args[0].op == "get_attr"):
            continue
        written = node.args[0]
        node.target = functional
        for user in list(written.users):
            if order[user] > order[node]:
                user.replace_input_with(written, node)
        buffer = written if written.op == "get_attr" else state_of.get(written)
        if buffer is not None:
            state_of[node], latest[buffer] = buffer, node
    out = next(n for n in reversed(graph.nodes) if n.op == "output")
    for buffer, value in latest.items():
        with graph.inserting_before(out):
            graph.call_function(aten.copy_.default, (buffer, value)).meta["val"] = buffer.meta.get("val")
    graph.lint()
    model.recompile()
    return model


_CASTS = {aten.to.dtype, aten.to.dtype_layout, aten._to_copy.default}


def _drop_same_dtype_casts(model: GraphModule) -> GraphModule:
    """Casts to the dtype a tensor already has (RMSNorm's ``.to(float32)`` of a float32 tensor) are the tensor:
    left in, each would requantize a value that does not change."""
    for node in list(model.graph.nodes):
        if node.op != "call_function" or node.target not in _CASTS or not isinstance(node.args[0], Node):
            continue
        src, out = node.args[0].meta.get("val"), node.meta.get("val")
        if (isinstance(src, torch.Tensor) and isinstance(out, torch.Tensor) and src.dtype == out.dtype
                and node.kwargs.get("memory_format") in (None, torch.preserve_format)):
            node.replace_all_uses_with(node.args[0])
            model.graph.erase_node(node)
    model.graph.lint()
    model.recompile()
    return model


VAR_OPS = {aten.var.correction, aten.var.dim, aten.var.default}


def _var_args(node: Node) -> tuple[list[int], float, bool]:
    """(dims, correction, keepdim) of any var overload."""
    rank = node.args[0].meta["val"].dim()
    args = list(node.args[1:]) + [None] * 3
    if node.target == aten.var.default:
        return list(range(rank)), float(args[0] if args[0] is not None else True), False
    dims = args[0] if args[0] is not None else list(range(rank))
    dims = [dims] if isinstance(dims, int) else list(dims) or list(range(rank))
    if node.target == aten.var.dim:
        unbiased = args[1] if args[1] is not None else True
        return dims, float(unbiased), bool(args[2])
    correction = node.kwargs.get("correction")
    return dims, float(1 if correction is None else correction), bool(node.kwargs.get("keepdim", False))


def _decompose_var(model: GraphModule) -> GraphModule:
    """var = mean(((x - mean(x)) * sqrt(N / (N - correction)))^2), each step quantized: the correction
    scales the deviations, so no quantization step is magnified after the last mean (which shares the
    squares' quantization: a mean over H and W lowers to AVG_POOL2D, which rounds to its input's)."""
    graph = model.graph
    for node in [n for n in graph.nodes if n.op == "call_function" and n.target in VAR_OPS]:
        x = node.args[0]
        if not is_float_tensor(x):
            continue
        dims, correction, keepdim = _var_args(node)
        count = math.prod(int(x.meta["val"].shape[d]) for d in dims)
        if count <= correction:  # torch gives inf or nan: leave it whole (and unquantized)
            continue

        def add(target, *args):
            with graph.inserting_before(node):
                new = graph.call_function(target, args)
            new.meta = {k: v for k, v in node.meta.items() if k in ("nn_module_stack", "stack_trace")}
            new.meta["val"] = target(*map_arg(args, lambda a: a.meta["val"]))
            return new

        dev = add(aten.sub.Tensor, x, add(aten.mean.dim, x, dims, True))
        if correction:
            name = f"_tosakit_var_factor_{node.name}"
            model.register_buffer(name, torch.tensor(math.sqrt(count / (count - correction))))
            with graph.inserting_before(node):
                factor = graph.get_attr(name)
            factor.meta["val"] = getattr(model, name)
            dev = add(aten.mul.Tensor, dev, factor)
        var = add(aten.mean.dim, add(aten.mul.Tensor, dev, dev), dims, keepdim)
        node.replace_all_uses_with(var)
        graph.erase_node(node)
    model.recompile()
    return model


def _replace_results(model: GraphModule, node: Node, out: Node | tuple[Node, ...]) -> None:
    """Put ``out`` (a node, or one per getitem of a multi-output op) in place of ``node``."""
    if isinstance(out, tuple):
        for item in list(node.users):
            item.replace_all_uses_with(out[item.args[1]])
            model.graph.erase_node(item)
    else:
        node.replace_all_uses_with(out)
    model.graph.erase_node(node)


def _layers_for_annotation(model: GraphModule, config_for: Callable[[Node], QuantizationConfig | None],
                           keep: frozenset = frozenset()) -> GraphModule:
    """Composite layers become primitives (softmax, norms, attention), so each step gets its own qparams; those in
    ``keep`` stay whole (a kernel computes them)."""
    for node in list(model.graph.nodes):
        rule = DECOMPOSE_FOR_ANNOTATION.get(node.target) if node.op == "call_function" and \
            node.target not in keep else None
        config = config_for(node) if rule is not None else None
        if config is None or not is_float_tensor(node.args[0]):
            continue  # left float: it stays whole for the float lowering
        f = Builder(model, node)
        out = rule(f, node)
        if out is None:
            continue
        for own in f.own_qparams:
            unary(own, config)
        _replace_results(model, node, out)
    model.graph.eliminate_dead_code()  # what only the decomposed layer read (a masked softmax's -inf fill)
    model.recompile()
    return model


CREATIONS = {  # ops that make a constant tensor -> its fill value
    aten.full.default: lambda n: n.args[1],
    aten.full_like.default: lambda n: n.args[1],
    aten.scalar_tensor.default: lambda n: n.args[0],
    aten.zeros.default: lambda n: 0.0,
    aten.zeros_like.default: lambda n: 0.0,
    aten.ones.default: lambda n: 1.0,
    aten.ones_like.default: lambda n: 1.0,
}
# ops with a number operand -> (where.self arguments from the node's, index of the number)
SELECTS_WITH_NUMBER = {
    aten.where.ScalarOther: (lambda a: (a[0], a[1], a[2]), 2),
    aten.where.ScalarSelf: (lambda a: (a[0], a[1], a[2]), 1),
    aten.masked_fill.Scalar: (lambda a: (a[1], a[2], a[0]), 1),
}


class _Constants:
    """Adds constant tensors to a graph module as buffers read by get_attr nodes."""

    def __init__(self, model: GraphModule):
        self.model = model
        self.count = 0

    def add(self, before: Node, value: torch.Tensor) -> Node:
        name = f"_tosakit_const_{self.count}"
        self.count += 1
        self.model.register_buffer(name, value)
        with self.model.graph.inserting_before(before):
            node = self.model.graph.get_attr(name)
        node.meta["val"] = value
        return node


def _fold_creation(node: Node, consts: _Constants) -> None:
    """full/zeros/ones (and *_like) with a float result: a constant, so it is quantized like a weight."""
    val = node.meta["val"]
    node.replace_all_uses_with(consts.add(node, torch.full(tuple(val.shape), CREATIONS[node.target](node),
                                                           dtype=val.dtype)))
    node.graph.erase_node(node)


def _select_with_tensors(node: Node, consts: _Constants) -> None:
    """where(c, x, 0.0), masked_fill(x, m, 1.0): where.self with a constant tensor for the number."""
    order, index = SELECTS_WITH_NUMBER[node.target]
    args = list(order(node.args))
    args[index] = consts.add(node, torch.tensor(float(args[index]), dtype=node.meta["val"].dtype))
    node.target, node.args = aten.where.self, tuple(args)


def _div_as_mul(node: Node, _consts: _Constants) -> None:
    """a / b = a * (1 / b): RECIPROCAL (a TABLE when quantized) then MUL, each with its own quantization."""
    a, b = node.args[:2]
    if isinstance(b, Node):
        with node.graph.inserting_before(node):
            b = node.graph.call_function(aten.reciprocal.default, (b,))
        b.meta = {**node.meta, "val": node.args[1].meta["val"]}
    elif b == 0:
        return  # left as it is: the lowering refuses it
    else:
        b = 1.0 / float(b)
    node.target, node.args = aten.mul.Tensor, (a, b)


def _rsub_as_sub(node: Node, consts: _Constants) -> None:
    """c - x (rsub) as sub with a constant tensor, so the constant is quantized."""
    x, c = node.args[:2]
    if node.kwargs.get("alpha", 1) == 1:
        c = consts.add(node, torch.tensor(float(c), dtype=x.meta["val"].dtype))
        node.target, node.args = aten.sub.Tensor, (c, x)


ELEMENTWISE_REWRITES = {
    **{t: _fold_creation for t in CREATIONS},
    **{t: _select_with_tensors for t in SELECTS_WITH_NUMBER},
    aten.div.Tensor: _div_as_mul,
    aten.div.Scalar: _div_as_mul,
    aten.rsub.Scalar: _rsub_as_sub,
}


def _elementwise_for_annotation(model: GraphModule) -> GraphModule:
    """Rewrite so the elementwise ops the quantizer meets have tensor operands (constants included)."""
    consts = _Constants(model)
    for node in list(model.graph.nodes):
        rewrite = ELEMENTWISE_REWRITES.get(node.target) if node.op == "call_function" else None
        if rewrite is not None and is_float_tensor(node):
            rewrite(node, consts)
    model.graph.lint()
    model.recompile()
    return model


def _scalar_to_tensor(model: GraphModule) -> GraphModule:
    """Turn scalar operands of binary ops into constant tensors so they can be quantized."""
    binary = {aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor, aten.add.Scalar,
              aten.sub.Scalar, aten.mul.Scalar, aten.div.Scalar}
    to_tensor = {aten.add.Scalar: aten.add.Tensor, aten.sub.Scalar: aten.sub.Tensor,
                 aten.mul.Scalar: aten.mul.Tensor, aten.div.Scalar: aten.div.Tensor}
    count = 0
    for node in list(model.graph.nodes):
        if node.op != "call_function" or node.target not in binary or len(node.args) < 2:
            continue
        a, b = node.args[:2]
        if not isinstance(a, Node) or not isinstance(b, (int, float)) or not is_float_tensor(a):
            continue
        name = f"_tosakit_scalar_{count}"
        count += 1
        model.register_buffer(name, torch.tensor(float(b), dtype=a.meta["val"].dtype))
        with model.graph.inserting_before(node):
            const = model.graph.get_attr(name)
            const.meta["val"] = getattr(model, name)
        node.args = (a, const, *node.args[2:])
        node.target = to_tensor.get(node.target, node.target)
    model.recompile()
    return model


def annotation_pipeline(config_for: Callable[[Node], QuantizationConfig | None],
                        keep: frozenset = frozenset()) -> list[Callable]:
    """The rewrites before annotation, in the order they run (``config_for`` picks the layers to decompose, ``keep``
    the composite ops that stay whole)."""
    return [_without_batch_norm_counters, _bias_before_batch_norm, _functional, fold_constants, addmm_as_linear,
            promote_constants, _drop_same_dtype_casts, _decompose_var,
            functools.partial(_layers_for_annotation, config_for=config_for, keep=keep), _elementwise_for_annotation,
            _scalar_to_tensor]
