"""PT2E quantizers for TOSA targets: annotate an exported graph op by op.

Annotation rules are a table keyed by ATen overload (one small function per
op family). Which config applies to a node is decided by module name, then
module type, then the global config (``None`` leaves the node in float).
"""

from __future__ import annotations

import math
import operator
import sys
from typing import Callable, Iterable

import torch
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    Quantizer,
    SharedQuantizationSpec,
)

from ..capture import fold_constants, promote_constants, written_attrs
from ..capture import graph_attr as _param
from ..errors import TosakitError
from ..specs import ArmCompileSpec, EthosUCompileSpec, TosaSpecification, VgfCompileSpec, require_spec
from .config import QuantizationConfig

aten = torch.ops.aten
ANNOTATION_KEY = "quantization_annotation"
CONFIG_KEY = "tosakit_qconfig"  # the config chosen for a node, set before the rules run

# Activations that fuse into the op before them: the pair shares one output quantization.
FUSABLE_ACTIVATIONS = {
    aten.relu.default,
    aten.relu_.default,
    aten.hardtanh.default,
    aten.hardtanh_.default,
    aten.clamp.default,
    aten.relu6.default,
}

# Ops whose output keeps the input's quantization (data movement, max, average, clamp).
SHARED_QPARAM_OPS = {
    aten.view.default,
    aten.reshape.default,
    aten.flatten.using_ints,
    aten.permute.default,
    aten.transpose.int,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.squeeze.default,
    aten.unsqueeze.default,
    aten.t.default,
    aten.contiguous.default,
    aten.clone.default,
    aten.dropout.default,
    aten.max_pool2d.default,
    aten.max_pool1d.default,
    aten.adaptive_avg_pool2d.default,
    aten.adaptive_avg_pool1d.default,
    aten.adaptive_max_pool2d.default,
    aten.adaptive_max_pool1d.default,
    aten.avg_pool1d.default,
    aten.avg_pool2d.default,
    aten.mean.dim,
    aten.mean.default,
    *FUSABLE_ACTIVATIONS,
}

Annotator = Callable[[Node, QuantizationConfig], None]
ANNOTATORS: dict[object, Annotator] = {}


def annotates(*targets):
    """Register an annotation rule for ATen overloads."""

    def register(fn: Annotator) -> Annotator:
        for t in targets:
            ANNOTATORS[t] = fn
        return fn

    return register


# ------------------------------------------------------------------ helpers


def _is_float_tensor(n) -> bool:
    val = n.meta.get("val") if isinstance(n, Node) else None
    return isinstance(val, torch.Tensor) and val.dtype.is_floating_point


def is_annotated(node: Node) -> bool:
    ann = node.meta.get(ANNOTATION_KEY)
    return ann is not None and ann._annotated


def _mark(node: Node, inputs: dict, output=None) -> None:
    node.meta[ANNOTATION_KEY] = QuantizationAnnotation(input_qspec_map=inputs, output_qspec=output, _annotated=True)


def _fused_activation(node: Node) -> Node | None:
    """The single activation user that fuses into ``node``, if any."""
    users = list(node.users)
    if len(users) == 1 and users[0].op == "call_function" and users[0].target in FUSABLE_ACTIVATIONS:
        if not is_annotated(users[0]) and users[0].meta.get(CONFIG_KEY) is not None:
            return users[0]
    return None


def _finish_with_output(node: Node, config: QuantizationConfig) -> None:
    """Put the output spec on ``node`` or on the activation fused after it."""
    act = _fused_activation(node)
    if act is None:
        node.meta[ANNOTATION_KEY].output_qspec = config.output_activation
        return
    _mark(act, {}, config.output_activation)


def _act_inputs(config: QuantizationConfig, *nodes) -> dict:
    return {n: config.input_activation for n in nodes if isinstance(n, Node) and _is_float_tensor(n)}


# ------------------------------------------------------------------ rules


CONV_OPS = (aten.conv1d.default, aten.conv2d.default, aten.conv2d.padding, aten.convolution.default,
            aten.linear.default)
WEIGHT_OPS = (*CONV_OPS, aten.conv_transpose2d.input)  # argument 1 is a weight


def _training_batch_norm(node: Node) -> Node | None:
    """The batch norm in training mode that alone reads ``node`` (a convolution being trained for quantization)."""
    users = list(node.users)
    if node.target in (aten.conv1d.default, aten.conv2d.default) and len(users) == 1 and \
            users[0].target == aten.batch_norm.default and users[0].args[5]:
        return users[0]
    return None


@annotates(*CONV_OPS)
def _conv(node: Node, config: QuantizationConfig) -> None:
    """A convolution or linear layer; in QAT, with the batch norm it feeds, whose output is quantized instead:
    torchao then trains the weights with the batch norm folded in and folds it for good at convert."""
    x, w = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else None
    transposed = node.target == aten.convolution.default and node.args[6]
    inputs = _act_inputs(config, x)
    inputs[w] = config.weight_spec(1 if transposed else 0)
    if isinstance(bias, Node):
        inputs[bias] = config.bias_spec((x, node), (w, node))
    _mark(node, inputs)
    bn = _training_batch_norm(node)
    if bn is not None and bn.meta.get(CONFIG_KEY) is not None and not is_annotated(bn):
        _mark(bn, {})
    else:
        bn = None
    _finish_with_output(bn or node, config)


@annotates(aten.conv_transpose2d.input)
def _conv_transpose(node: Node, config: QuantizationConfig) -> None:
    x, w = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else None
    inputs = _act_inputs(config, x)
    inputs[w] = config.weight_spec(1)
    if isinstance(bias, Node):
        inputs[bias] = config.bias_spec((x, node), (w, node))
    _mark(node, inputs)
    _finish_with_output(node, config)


@annotates(aten.add.Tensor, aten.add_.Tensor, aten.sub.Tensor, aten.sub_.Tensor, aten.mul.Tensor, aten.mul_.Tensor)
def _binary(node: Node, config: QuantizationConfig) -> None:
    _mark(node, _act_inputs(config, *node.args[:2]))
    _finish_with_output(node, config)


@annotates(*SHARED_QPARAM_OPS)
def _shared(node: Node, config: QuantizationConfig) -> None:
    x = node.args[0]
    if not _is_float_tensor(x):
        return
    _mark(node, {x: config.input_activation}, SharedQuantizationSpec((x, node)))


@annotates(
    aten.softmax.int,
    aten._softmax.default,
    aten.log_softmax.int,
    aten.sigmoid.default,
    aten.tanh.default,
    aten.exp.default,
    aten.hardswish.default,
    aten.hardsigmoid.default,
    aten.gelu.default,
    aten.silu.default,
)
def _unary(node: Node, config: QuantizationConfig) -> None:
    _mark(node, _act_inputs(config, node.args[0]), config.output_activation)


# ------------------------------------------------------------------ rules: elementwise and activations

COMPARISONS = [getattr(op, overload) for op in (aten.eq, aten.ne, aten.gt, aten.ge, aten.lt, aten.le)
               for overload in ("Tensor", "Scalar")]


@annotates(
    aten.log.default, aten.sin.default, aten.cos.default, aten.sqrt.default, aten.rsqrt.default, aten.reciprocal.default, aten.erf.default,
    aten.pow.Tensor_Scalar, aten.abs.default, aten.neg.default, aten.leaky_relu.default, aten.leaky_relu_.default,
    aten.elu.default, aten.elu_.default, aten.selu.default, aten.silu_.default, aten.hardswish_.default,
    aten.hardsigmoid_.default, aten.maximum.default, aten.minimum.default, aten.where.self, *COMPARISONS,
)
def _elementwise(node: Node, config: QuantizationConfig) -> None:
    """Each float tensor argument quantized on its own; a float result gets its own quantization
    (comparisons give bool, which has none)."""
    inputs = _act_inputs(config, *node.args)
    if inputs:
        _mark(node, inputs, config.output_activation if _is_float_tensor(node) else None)


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
        if node.op != "call_function" or _training_batch_norm(node) is None or \
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


def _elementwise_for_annotation(model: GraphModule) -> GraphModule:
    """Rewrite so the elementwise ops the quantizer meets have tensor operands (constants included)."""
    consts = _Constants(model)
    for node in list(model.graph.nodes):
        rewrite = ELEMENTWISE_REWRITES.get(node.target) if node.op == "call_function" else None
        if rewrite is not None and _is_float_tensor(node):
            rewrite(node, consts)
    model.graph.lint()
    model.recompile()
    return model


# ------------------------------------------------------------------ rules: data movement and reductions

# Ops that move or select elements (and max/min, which pick one): the output keeps the input's qparams.
MOVEMENT_OPS = {
    aten.slice.Tensor, aten.select.int, aten.narrow.default, aten.expand.default, aten.expand_as.default,
    aten.repeat.default, aten.tile.default, aten.flip.default, aten.unflatten.int, aten.index_select.default,
    aten.index.Tensor, aten.gather.default, aten.pad.default, aten.constant_pad_nd.default, aten.amax.default,
    aten.amin.default, aten.max.default, aten.min.default, aten.movedim.int, aten.swapaxes.default,
}
SHARED_QPARAM_OPS.update(MOVEMENT_OPS)
annotates(*MOVEMENT_OPS)(_shared)

# Ops with several outputs (read through getitem), each a part of the input.
SPLIT_OPS = {aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, aten.unbind.int,
             aten.tensor_split.sections, aten.tensor_split.indices}


def _shared_items(node: Node, config: QuantizationConfig, only: int | None = None) -> None:
    """The getitem outputs (all, or just item ``only``) share the input's quantization."""
    x = node.args[0]
    if not _is_float_tensor(x):
        return
    _mark(node, {x: config.input_activation})
    for item in node.users:
        if item.target is operator.getitem and only in (None, item.args[1]):
            _mark(item, {}, SharedQuantizationSpec((x, node)))


@annotates(*SPLIT_OPS)
def _split(node: Node, config: QuantizationConfig) -> None:
    """Every part shares the input's quantization."""
    _shared_items(node, config)


@annotates(aten.cat.default, aten.concat.default, aten.concatenate.default, aten.stack.default)
def _cat(node: Node, config: QuantizationConfig) -> None:
    """One quantization for all inputs and the output, so CONCAT copies integers unchanged."""
    inputs = [n for n in node.args[0] if _is_float_tensor(n)]
    if not inputs:
        return
    shared = SharedQuantizationSpec((inputs[0], node))
    _mark(node, {n: config.input_activation if n is inputs[0] else shared for n in inputs}, shared)


@annotates(aten.index_put.default)
def _index_put(node: Node, config: QuantizationConfig) -> None:
    """The values written take x's quantization, so SCATTER copies integers unchanged (a KV cache keeps one)."""
    x, values = node.args[0], node.args[2]
    if not _is_float_tensor(x):
        return
    shared = SharedQuantizationSpec((x, node))
    _mark(node, {x: config.input_activation, **({values: shared} if _is_float_tensor(values) else {})}, shared)


@annotates(aten.sum.dim_IntList, aten.sum.default, aten.cumsum.default)
def _sum(node: Node, config: QuantizationConfig) -> None:
    """A sum spans a wider range than its input: its own output quantization."""
    if _is_float_tensor(node):
        _unary(node, config)


@annotates(aten.argmax.default)
def _argmax(node: Node, config: QuantizationConfig) -> None:
    """Quantized input, integer index output (no output quantization)."""
    _mark(node, _act_inputs(config, node.args[0]))


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
        if not _is_float_tensor(x):
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


# ------------------------------------------------------------------ rules: layers (conv, matmul, pools, norms, attention, recurrent)

annotates(aten.matmul.default, aten.bmm.default, aten.mm.default)(_binary)  # both operands are activations
annotates(aten.upsample_nearest2d.vec, aten.upsample_bilinear2d.vec)(_shared)  # RESIZE keeps the scale
annotates(aten.embedding.default)(_shared)  # GATHER copies int8 rows of the (activation-quantized) table


@annotates(aten.adaptive_max_pool2d.default)
def _adaptive_max_pool(node: Node, config: QuantizationConfig) -> None:
    """The values (getitem 0) share the input's quantization; the indices stay integers."""
    _shared_items(node, config, only=0)


class _Builder:
    """Adds ATen calls before ``node`` (with fake values and the node's module metadata), and constants."""

    def __init__(self, model: GraphModule, node: Node):
        self.model, self.node = model, node
        self.meta = {k: v for k, v in node.meta.items() if k in ("nn_module_stack", "stack_trace")}
        self.own_qparams: list[Node] = []  # nodes whose output needs its own quantization

    def own(self, node: Node) -> Node:
        """Mark ``node`` (say a mean, which normally shares its input's qparams) to get its own."""
        self.own_qparams.append(node)
        return node

    def __call__(self, target, *args) -> Node:
        with self.model.graph.inserting_before(self.node):
            new = self.model.graph.call_function(target, args)
        new.meta = dict(self.meta)
        new.meta["val"] = target(*map_arg(args, lambda a: a.meta["val"]))
        return new

    def constant(self, suffix: str, value: torch.Tensor) -> Node:
        name = f"_tosakit_{self.node.name}_{suffix}"
        self.model.register_buffer(name, value.detach().clone())
        with self.model.graph.inserting_before(self.node):
            const = self.model.graph.get_attr(name)
        const.meta["val"] = getattr(self.model, name)
        return const


def _softmax_parts(f: _Builder, x: Node, dim: int) -> tuple[Node, Node, Node]:
    """max along ``dim``, exp(x - max) and its sum along ``dim``."""
    top = f(aten.amax.default, x, [dim], True)
    e = f(aten.exp.default, f(aten.sub.Tensor, x, top))
    return top, e, f(aten.sum.dim_IntList, e, [dim], True)


def _softmax(f: _Builder, x: Node, dim: int) -> Node:
    """exp(x - max) * reciprocal(sum): TABLE ops for exp and reciprocal, REDUCE_SUM between."""
    _, e, total = _softmax_parts(f, x, dim)
    return f(aten.mul.Tensor, e, f(aten.reciprocal.default, total))


def _log_softmax(f: _Builder, x: Node, dim: int) -> Node:
    """x - (max + log(sum(exp(x - max)))): x - max feeds only the exp, so Vela runs the SUB, its RESCALE and
    the exp's TABLE as one pass, and the log and the add work on the reduced tensor."""
    top, _, total = _softmax_parts(f, x, dim)
    return f(aten.sub.Tensor, x, f(aten.add.Tensor, top, f(aten.log.default, total)))


def _normalize(f: _Builder, x: Node, dims: list[int], eps: float) -> Node:
    """(x - mean) * rsqrt(var + eps) over ``dims``, every step its own op."""
    dev = f(aten.sub.Tensor, x, f.own(f(aten.mean.dim, x, dims, True)))
    var = f.own(f(aten.mean.dim, f(aten.mul.Tensor, dev, dev), dims, True))
    return f(aten.mul.Tensor, dev, f(aten.rsqrt.default, f(aten.add.Tensor, var, float(eps))))


def _affine(f: _Builder, y: Node, weight, bias, shape) -> Node:
    """y * weight + bias with the parameters viewed as ``shape``."""
    if isinstance(weight, Node):
        y = f(aten.mul.Tensor, y, f.constant("weight", _param(f.model, weight).reshape(shape)))
    if isinstance(bias, Node):
        y = f(aten.add.Tensor, y, f.constant("bias", _param(f.model, bias).reshape(shape)))
    return y


def _decompose_softmax(f: _Builder, node: Node) -> Node | None:
    if len(node.args) > 2 and node.args[2] not in (None, False):
        return None  # softmax with a dtype conversion stays whole
    fn = _log_softmax if node.target == aten.log_softmax.int else _softmax
    return fn(f, node.args[0], node.args[1])


def _decompose_layer_norm(f: _Builder, node: Node) -> Node | None:
    x, shape = node.args[0], list(node.args[1])
    args = list(node.args) + [None] * 3
    rank = x.meta["val"].dim()
    y = _normalize(f, x, list(range(rank - len(shape), rank)), args[4] if args[4] is not None else 1e-5)
    return _affine(f, y, args[2], args[3], shape)


def _decompose_group_norm(f: _Builder, node: Node) -> Node | None:
    x, groups = node.args[0], node.args[1]
    args = list(node.args) + [None] * 4
    shape = list(x.meta["val"].shape)
    grouped = f(aten.view.default, x, [shape[0], groups, -1])
    y = f(aten.view.default, _normalize(f, grouped, [2], args[4] if args[4] is not None else 1e-5), shape)
    return _affine(f, y, args[2], args[3], [shape[1]] + [1] * (len(shape) - 2))


def _decompose_batch_norm(f: _Builder, node: Node) -> Node | None:
    """Inference batch norm (not folded into a conv) as x * scale + shift per channel."""
    x, weight, bias, mean, var, training = node.args[:6]
    if training or not all(isinstance(a, Node) for a in (mean, var)):
        return None
    eps = node.args[7]
    scale = torch.rsqrt(_param(f.model, var).double() + eps)
    if isinstance(weight, Node):
        scale = scale * _param(f.model, weight).double()
    shift = -_param(f.model, mean).double() * scale
    if isinstance(bias, Node):
        shift = shift + _param(f.model, bias).double()
    shape = [-1] + [1] * (x.meta["val"].dim() - 2)
    y = f(aten.mul.Tensor, x, f.constant("scale", scale.float().reshape(shape)))
    return f(aten.add.Tensor, y, f.constant("shift", shift.float().reshape(shape)))


# Views torch's attention puts between the mask it builds and the attention that reads it.
_MASK_VIEWS = {aten.view.default, aten.reshape.default, aten.expand.default, aten.unsqueeze.default,
               aten._unsafe_view.default}


def _masked_positions(f: _Builder, mask: Node) -> Node | None:
    """Where an attention mask leaves a score out, as a bool tensor of the mask's shape: not a boolean mask; or the
    -inf of the additive mask torch builds from a boolean one (``masked_fill`` of zeros), through its views. None
    for any other additive mask."""
    if mask.meta["val"].dtype == torch.bool:
        return f(aten.logical_not.default, mask)
    if mask.op == "get_attr":  # a mask known at export (causal), folded: 0 where kept, -inf where left out
        value = _param(f.model, mask)
        return f.constant("masked", value == float("-inf")) if bool(((value == 0) | value.isneginf()).all()) else None
    views = []
    while mask.op == "call_function" and mask.target in _MASK_VIEWS:
        views.append(mask)
        mask = mask.args[0]
    zeros = mask.args[0] if mask.op == "call_function" and mask.target == aten.masked_fill.Scalar else None
    if zeros is None or mask.args[2] != float("-inf") or getattr(zeros, "target", None) not in (
            aten.zeros_like.default, aten.zeros.default):
        return None
    masked = mask.args[1]
    for view in reversed(views):
        masked = f(view.target, masked, *view.args[1:])
    return masked


def _decompose_sdpa(f: _Builder, node: Node) -> Node | None:
    """softmax(q @ k^T * scale) @ v, without dropout or causal masking; a mask's left-out scores weigh 0 (their
    exp set to 0 before the sum: no -inf to quantize)."""
    q, k, v = node.args[:3]
    opts = {**dict(zip(("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"), node.args[3:])), **node.kwargs}
    if opts.get("dropout_p") or opts.get("is_causal") or opts.get("enable_gqa"):
        return None
    masked = opts.get("attn_mask")
    if masked is not None and (masked := _masked_positions(f, masked)) is None:
        return None
    scale = opts.get("scale")
    scale = scale if scale is not None else q.meta["val"].shape[-1] ** -0.5
    scores = f(aten.mul.Tensor, f(aten.matmul.default, q, f(aten.transpose.int, k, -2, -1)), float(scale))
    if masked is None:
        return f(aten.matmul.default, _softmax(f, scores, -1), v)
    _, e, _ = _softmax_parts(f, scores, -1)
    e = f(aten.where.ScalarSelf, masked, 0.0, e)
    weights = f(aten.mul.Tensor, e, f(aten.reciprocal.default, f(aten.sum.dim_IntList, e, [-1], True)))
    return f(aten.matmul.default, weights, v)


def _decompose_glu(f: _Builder, node: Node) -> Node:
    """GLU: the first half of x along ``dim`` times the sigmoid of the second."""
    x, dim = node.args[0], (node.args[1] if len(node.args) > 1 else -1)
    half = x.meta["val"].shape[dim] // 2
    gate = f(aten.sigmoid.default, f(aten.slice.Tensor, x, dim, half, 2 * half))
    return f(aten.mul.Tensor, f(aten.slice.Tensor, x, dim, 0, half), gate)


def _initial_state(f: _Builder, state: Node, slot: int) -> Node | None:
    """The initial state of one layer and direction, or None when it is zeros (its terms then drop out)."""
    if state.target in (aten.zeros.default, aten.zeros_like.default) or (
            state.op == "get_attr" and not _param(f.model, state).any()):
        return None
    return f(aten.select.int, state, 0, slot)


class _Gates:
    """One recurrent layer's weights, split per gate: W_ih x + b for all steps, W_hh h per step."""

    def __init__(self, f: _Builder, params: list[Node], slot: int, count: int, biases: bool):
        per = 4 if biases else 2
        w_ih, w_hh = (_param(f.model, p) for p in params[per * slot: per * slot + 2])
        b_ih, b_hh = ((_param(f.model, p) for p in params[per * slot + 2: per * slot + 4]) if biases
                      else (torch.zeros(w_ih.shape[0]), torch.zeros(w_ih.shape[0])))
        self.f, self.size = f, w_hh.shape[1]
        rows = [slice(k * self.size, (k + 1) * self.size) for k in range(count)]
        name = f"l{slot}"
        self.w_ih = [f.constant(f"{name}_w_ih{k}", w_ih[r]) for k, r in enumerate(rows)]
        self.w_hh = [f.constant(f"{name}_w_hh{k}", w_hh[r]) for k, r in enumerate(rows)]
        self.b_ih = [b_ih[r] for r in rows]
        self.b_hh = [b_hh[r] for r in rows]
        self.name = name

    def inputs(self, seq: Node, k: int, with_hidden_bias: bool) -> Node:
        """W_ih x + b_ih (+ b_hh) of gate ``k`` for every time step at once."""
        bias = self.b_ih[k] + self.b_hh[k] if with_hidden_bias else self.b_ih[k]
        return self.f(aten.linear.default, seq, self.w_ih[k], self.f.constant(f"{self.name}_b{k}", bias))

    def hidden(self, h: Node, k: int, bias: bool = False) -> Node:
        """W_hh h (+ b_hh) of gate ``k`` at one step."""
        b = self.f.constant(f"{self.name}_b_hh{k}", self.b_hh[k]) if bias else None
        return self.f(aten.linear.default, h, self.w_hh[k], b)


def _lstm_step(f: _Builder, xs: list[Node], g: _Gates, h: Node | None, c: Node | None) -> tuple[Node, Node]:
    """i, f, g, o gates; c' = f * c + i * g; h' = o * tanh(c')."""
    pre = [x if h is None else f(aten.add.Tensor, x, g.hidden(h, k)) for k, x in enumerate(xs)]
    i, fg, o = (f(aten.sigmoid.default, pre[k]) for k in (0, 1, 3))
    cand = f(aten.tanh.default, pre[2])
    c = f(aten.mul.Tensor, i, cand) if c is None else f(aten.add.Tensor, f(aten.mul.Tensor, fg, c),
                                                         f(aten.mul.Tensor, i, cand))
    return f(aten.mul.Tensor, o, f(aten.tanh.default, c)), c


def _gru_step(f: _Builder, xs: list[Node], g: _Gates, h: Node | None) -> Node:
    """r, z gates; n = tanh(x_n + r * (W_hn h + b_hn)); h' = n + z * (h - n)."""
    r, z = (f(aten.sigmoid.default, xs[k] if h is None else f(aten.add.Tensor, xs[k], g.hidden(h, k)))
            for k in (0, 1))
    hn = g.hidden(h, 2, bias=True) if h is not None else f.constant(f"{g.name}_b_hn", g.b_hh[2])
    n = f(aten.tanh.default, f(aten.add.Tensor, xs[2], f(aten.mul.Tensor, r, hn)))
    if h is None:
        return f(aten.sub.Tensor, n, f(aten.mul.Tensor, z, n))
    return f(aten.add.Tensor, n, f(aten.mul.Tensor, z, f(aten.sub.Tensor, h, n)))


def _decompose_rnn(f: _Builder, node: Node) -> tuple[Node, ...] | None:
    """nn.LSTM / nn.GRU (inference; one or two directions) unrolled over time: per-gate linears, sigmoid/tanh,
    products and sums, every one its own op with its own quantization. A bidirectional layer runs a second set of
    weights from the last step back and concatenates its outputs after the forward ones."""
    x, hx, params, biases, layers, _, train, bidirectional, batch_first = node.args
    if train:
        return None
    lstm = node.target == aten.lstm.input
    count, time_dim, directions = (4 if lstm else 3), (1 if batch_first else 0), (2 if bidirectional else 1)
    steps = x.meta["val"].shape[time_dim]
    seq, finals = x, ([], [])
    for layer in range(layers):
        outputs = []
        for direction in range(directions):
            slot = layer * directions + direction  # PyTorch's order of weights and states
            g = _Gates(f, params, slot, count, biases)
            projected = [g.inputs(seq, k, with_hidden_bias=lstm or k < 2) for k in range(count)]
            h = _initial_state(f, hx[0] if lstm else hx, slot)
            c = _initial_state(f, hx[1], slot) if lstm else None
            outs = [None] * steps
            for t in (reversed(range(steps)) if direction else range(steps)):
                xs = [f(aten.select.int, p, time_dim, t) for p in projected]
                h, c = _lstm_step(f, xs, g, h, c) if lstm else (_gru_step(f, xs, g, h), None)
                outs[t] = h
            outputs.append(f(aten.stack.default, outs, time_dim))
            finals[0].append(h)
            finals[1].append(c)
        seq = outputs[0] if directions == 1 else f(aten.cat.default, outputs, -1)
    states = [f(aten.stack.default, finals[0], 0)] + ([f(aten.stack.default, finals[1], 0)] if lstm else [])
    return (seq, *states)


DECOMPOSE_FOR_ANNOTATION = {
    aten.softmax.int: _decompose_softmax,
    aten._softmax.default: _decompose_softmax,
    aten.log_softmax.int: _decompose_softmax,
    aten.layer_norm.default: _decompose_layer_norm,
    aten.group_norm.default: _decompose_group_norm,
    aten.batch_norm.default: _decompose_batch_norm,
    aten.scaled_dot_product_attention.default: _decompose_sdpa,
    aten.glu.default: _decompose_glu,
    aten.lstm.input: _decompose_rnn,
    aten.gru.input: _decompose_rnn,
}


def _replace_results(model: GraphModule, node: Node, out: Node | tuple[Node, ...]) -> None:
    """Put ``out`` (a node, or one per getitem of a multi-output op) in place of ``node``."""
    if isinstance(out, tuple):
        for item in list(node.users):
            item.replace_all_uses_with(out[item.args[1]])
            model.graph.erase_node(item)
    else:
        node.replace_all_uses_with(out)
    model.graph.erase_node(node)


def _layers_for_annotation(model: GraphModule, config_for: Callable[[Node], QuantizationConfig | None]) -> GraphModule:
    """Composite layers become primitives (softmax, norms, attention), so each step gets its own qparams."""
    for node in list(model.graph.nodes):
        rule = DECOMPOSE_FOR_ANNOTATION.get(node.target) if node.op == "call_function" else None
        config = config_for(node) if rule is not None else None
        if config is None or not _is_float_tensor(node.args[0]):
            continue  # left float: it stays whole for the float lowering
        f = _Builder(model, node)
        out = rule(f, node)
        if out is None:
            continue
        for own in f.own_qparams:
            _unary(own, config)
        _replace_results(model, node, out)
    model.recompile()
    return model



# ------------------------------------------------------------------ quantizers


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
        if not isinstance(a, Node) or not isinstance(b, (int, float)) or not _is_float_tensor(a):
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


class TOSAQuantizer(Quantizer):
    """Quantizer for TOSA INT targets; ``EthosUQuantizer`` and ``VgfQuantizer`` specialise it."""

    def __init__(self, compile_spec_or_tosa_spec: ArmCompileSpec | TosaSpecification | str):
        super().__init__()
        spec = compile_spec_or_tosa_spec
        if isinstance(spec, str):
            spec = TosaSpecification.create_from_string(spec)
        self.compile_spec = spec if isinstance(spec, ArmCompileSpec) else None
        self.tosa_spec = spec.tosa_spec if isinstance(spec, ArmCompileSpec) else spec
        if not self.tosa_spec.support_integer():
            raise TosakitError(
                f"{type(self).__name__} needs an integer TOSA profile, but the target is {self.tosa_spec}",
                "quantize for a '+INT' target (e.g. TOSA-1.0+INT, an Ethos-U target or vgf)",
            )
        self.global_config: QuantizationConfig | None = None
        self.io_config: QuantizationConfig | None = None
        self.module_name_config: dict[str, QuantizationConfig | None] = {}
        self.module_type_config: dict[object, QuantizationConfig | None] = {}

    def set_global(self, quantization_config: QuantizationConfig | None) -> "TOSAQuantizer":
        """Config for every node no name or type filter matches (``None``: stay float)."""
        self.global_config = quantization_config
        return self

    def set_io(self, quantization_config: QuantizationConfig | None, integer_io: bool = False) -> "TOSAQuantizer":
        """Config for the model's input and output activations; ``integer_io=True`` also makes the program
        take and return those integers (the shared compile spec's ``with_int8_io()``), so firmware feeds the
        delegate directly with no CPU quantize/dequantize around it."""
        self.io_config = quantization_config
        if integer_io:
            if self.compile_spec is None:
                raise TosakitError("set_io(..., integer_io=True) needs the quantizer built from a compile spec",
                                   "pass the EthosUCompileSpec/VgfCompileSpec you give the partitioner, or call "
                                   "compile_spec.with_int8_io() yourself")
            if quantization_config is None:
                raise TosakitError("set_io(None, integer_io=True): float I/O cannot be integer",
                                   "give set_io a quantization config, e.g. get_symmetric_quantization_config()")
            self.compile_spec.with_int8_io()
        return self

    def set_module_name(self, module_name: str, quantization_config: QuantizationConfig | None) -> "TOSAQuantizer":
        """Config for nodes inside the submodule with this fully qualified name."""
        self.module_name_config[module_name] = quantization_config
        return self

    def set_module_type(self, module_type, quantization_config: QuantizationConfig | None) -> "TOSAQuantizer":
        """Config for nodes inside submodules of this type."""
        self.module_type_config[module_type] = quantization_config
        return self

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """Prepare the graph for annotation: constants folded, in-place ops functional, scalar operands tensors."""
        model = _functional(_bias_before_batch_norm(_without_batch_norm_counters(model)))
        model = _decompose_var(_drop_same_dtype_casts(promote_constants(fold_constants(model))))
        return _scalar_to_tensor(_elementwise_for_annotation(_layers_for_annotation(model, self.config_for)))

    def config_for(self, node: Node) -> QuantizationConfig | None:
        """The config that applies to ``node``: module name, then module type, then global."""
        stack = list((node.meta.get("nn_module_stack") or {}).values())
        for fqn, _ in reversed(stack):
            for name, cfg in self.module_name_config.items():
                if fqn == name or fqn.startswith(name + "."):
                    return cfg
        for _, mtype in reversed(stack):
            for t, cfg in self.module_type_config.items():
                if mtype == t or mtype == f"{getattr(t, '__module__', '')}.{getattr(t, '__qualname__', t)}":
                    return cfg
        return self.global_config

    def annotate(self, model: GraphModule) -> GraphModule:
        """Attach quantization annotations to every node a config covers."""
        nodes = [n for n in model.graph.nodes if n.op == "call_function"]
        for node in nodes:
            node.meta[CONFIG_KEY] = self.config_for(node)
        for node in nodes:
            rule = ANNOTATORS.get(node.target)
            config = node.meta.pop(CONFIG_KEY)
            if rule is not None and config is not None and not is_annotated(node):
                rule(node, config)
        for node in nodes:  # integer and bool values stay as they are, whatever op made them
            ann = node.meta.get(ANNOTATION_KEY)
            if ann is not None and not _is_float_tensor(node) and not isinstance(node.meta.get("val"), (tuple, list)):
                ann.output_qspec = None
        if self.io_config is not None:
            self._annotate_io(model, self.io_config)
        _state_read_as_written(nodes)
        return model

    def _annotate_io(self, model: GraphModule, config: QuantizationConfig) -> None:
        for node in model.graph.nodes:
            if node.op == "placeholder" and _is_float_tensor(node):
                for user in node.users:
                    ann = user.meta.get(ANNOTATION_KEY)
                    if ann is not None and node in ann.input_qspec_map:
                        ann.input_qspec_map[node] = config.input_activation
            elif node.op == "output":
                for out in node.all_input_nodes:
                    ann = out.meta.get(ANNOTATION_KEY)
                    if ann is not None and ann.output_qspec is not None and not isinstance(
                        ann.output_qspec, SharedQuantizationSpec
                    ):
                        ann.output_qspec = config.output_activation

    def validate(self, model: GraphModule) -> None:
        """Nothing to check beyond what annotation already enforces."""

    def quantize_with_submodules(self, model: GraphModule, calibration_samples: Iterable[tuple], is_qat: bool = False):
        """Prepare, calibrate on every sample, and convert ``model`` in one call."""
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e, prepare_qat_pt2e

        prepared = (prepare_qat_pt2e if is_qat else prepare_pt2e)(model, self)
        calibrate(prepared, calibration_samples)
        return convert_pt2e(prepared)


def _state_read_as_written(nodes: list[Node]) -> None:
    """State (a buffer forward() writes, ``copy_(buffer, value)``) is written at the quantization it is read with,
    observed over both: the program keeps the state as integers, with no conversion around it. A value whose
    quantization follows the state's already (a KV cache's index_put) is left as it is."""
    for write in nodes:
        if write.target is not aten.copy_.default or not isinstance(write.args[0], Node) or \
                write.args[0].op != "get_attr" or not isinstance(write.args[1], Node):
            continue
        state, value = write.args[:2]
        ann = value.meta.get(ANNOTATION_KEY)
        reads = [u for u in state.users if u is not write and state in getattr(u.meta.get(ANNOTATION_KEY),
                                                                               "input_qspec_map", {})]
        if ann is None or ann.output_qspec is None or isinstance(ann.output_qspec, SharedQuantizationSpec) \
                or not reads:
            continue
        first = min(reads, key=nodes.index)
        for user in reads[1:] if first is reads[0] else reads:
            if user is not first:
                user.meta[ANNOTATION_KEY].input_qspec_map[state] = SharedQuantizationSpec((state, first))
        ann.output_qspec = SharedQuantizationSpec((state, first))


def _is_weight(node: Node, inp: Node) -> bool:
    """``inp`` is the weight operand of a convolution or linear ``node`` (a constant added or multiplied is an
    activation)."""
    return node.target in WEIGHT_OPS and len(node.args) > 1 and node.args[1] is inp


def calibrate(prepared: GraphModule, samples: Iterable, progress: bool | None = None) -> int:
    """Run ``prepared`` on every sample (a tuple of inputs, a tensor, or a DataLoader batch whose first
    entries are the inputs), with a progress bar on a terminal. Returns how many samples ran."""
    from tqdm import tqdm

    arity = sum(1 for n in prepared.graph.nodes if n.op == "placeholder")
    total = len(samples) if hasattr(samples, "__len__") else None
    show = sys.stderr.isatty() if progress is None else progress
    seen = 0
    state = {name: _param(prepared, name).clone() for name in written_attrs(prepared.graph)}
    with torch.no_grad():
        for sample in tqdm(samples, desc="calibrating", total=total, disable=not show, unit="sample", leave=False):
            inputs = tuple(sample) if isinstance(sample, (tuple, list)) else (sample,)
            prepared(*inputs[:arity])
            seen += 1
        for name, initial in state.items():  # the samples ran in sequence, updating the state; it starts over
            _param(prepared, name).copy_(initial)
    if seen == 0:
        raise TosakitError("calibration got no samples", "pass a non-empty list of input tuples or a DataLoader")
    return seen


class EthosUQuantizer(TOSAQuantizer):
    """Quantizer for Ethos-U targets (integer only: everything must be quantized)."""

    # what the NPU multiplies: int8 weights with int8 or int16 activations
    WEIGHTS = (torch.int8,)
    ACTIVATIONS = (torch.int8, torch.int16)

    def __init__(self, compile_spec: EthosUCompileSpec):
        super().__init__(require_spec(compile_spec, EthosUCompileSpec, "EthosUQuantizer"))

    def validate(self, model: GraphModule) -> None:
        """Refuse, before anything is lowered, a quantization the NPU cannot run."""
        for node in model.graph.nodes:
            ann = node.meta.get(ANNOTATION_KEY)
            if ann is None:
                continue
            for inp, spec in ann.input_qspec_map.items():
                dtype = getattr(spec, "dtype", None)
                allowed = self.WEIGHTS if inp.op in ("get_attr", "placeholder") and dtype != torch.int32 and \
                    _is_weight(node, inp) else self.ACTIVATIONS + (torch.int32,)
                if dtype is not None and dtype not in allowed:
                    raise TosakitError(
                        f"node {node.name} ({node.target}) is configured with {dtype} "
                        f"{'weights' if allowed == self.WEIGHTS else 'activations'}, which "
                        f"{self.compile_spec.target} cannot run",
                        "use get_symmetric_quantization_config() (int8) or get_symmetric_a16w8_quantization_config() "
                        "(int16 activations, int8 weights)")


class VgfQuantizer(TOSAQuantizer):
    """Quantizer for VGF targets (partial quantization allowed)."""

    def __init__(self, compile_spec: VgfCompileSpec):
        super().__init__(require_spec(compile_spec, VgfCompileSpec, "VgfQuantizer"))

