"""The annotation table: for each ATen overload the rule that says how its inputs and output are quantized
(one small function per op family, registered with ``@annotates``), with the op sets the rules share."""

from __future__ import annotations

import operator
from typing import Callable

import torch
from torch.fx import Node
from torchao.quantization.pt2e.quantizer import DerivedQuantizationSpec, QuantizationAnnotation, SharedQuantizationSpec

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


def is_float_tensor(n) -> bool:
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
    return {n: config.input_activation for n in nodes if isinstance(n, Node) and is_float_tensor(n)}


# ------------------------------------------------------------------ rules


CONV_OPS = (aten.conv1d.default, aten.conv2d.default, aten.conv2d.padding, aten.convolution.default,
            aten.linear.default)
WEIGHT_OPS = (*CONV_OPS, aten.conv_transpose2d.input)  # argument 1 is a weight


def training_batch_norm(node: Node) -> Node | None:
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
    bn = training_batch_norm(node)
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
    if not is_float_tensor(x):
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
def unary(node: Node, config: QuantizationConfig) -> None:
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
        _mark(node, inputs, config.output_activation if is_float_tensor(node) else None)


# ------------------------------------------------------------------ rules: data movement and reductions

# Ops that move or select elements (and max/min, which pick one): the output keeps the input's qparams.
MOVEMENT_OPS = {
    aten.slice.Tensor, aten.select.int, aten.narrow.default, aten.expand.default, aten.expand_as.default,
    aten.repeat.default, aten.tile.default, aten.flip.default, aten.unflatten.int, aten.index_select.default,
    aten.index.Tensor, aten.gather.default, aten.pad.default, aten.constant_pad_nd.default, aten.amax.default,
    aten.amin.default, aten.max.default, aten.min.default, aten.movedim.int, aten.swapaxes.default,
}
annotates(*MOVEMENT_OPS)(_shared)

# Ops with several outputs (read through getitem), each a part of the input.
SPLIT_OPS = {aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default, aten.unbind.int,
             aten.tensor_split.sections, aten.tensor_split.indices}


def _shared_items(node: Node, config: QuantizationConfig, only: int | None = None) -> None:
    """The getitem outputs (all, or just item ``only``) share the input's quantization."""
    x = node.args[0]
    if not is_float_tensor(x):
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
    inputs = [n for n in node.args[0] if is_float_tensor(n)]
    if not inputs:
        return
    shared = SharedQuantizationSpec((inputs[0], node))
    _mark(node, {n: config.input_activation if n is inputs[0] else shared for n in inputs}, shared)


@annotates(aten.index_put.default)
def _index_put(node: Node, config: QuantizationConfig) -> None:
    """The values written take x's quantization, so SCATTER copies integers unchanged (a KV cache keeps one)."""
    x, values = node.args[0], node.args[2]
    if not is_float_tensor(x):
        return
    shared = SharedQuantizationSpec((x, node))
    _mark(node, {x: config.input_activation, **({values: shared} if is_float_tensor(values) else {})}, shared)


@annotates(aten.sum.dim_IntList, aten.sum.default, aten.cumsum.default)
def _sum(node: Node, config: QuantizationConfig) -> None:
    """A sum spans a wider range than its input: its own output quantization."""
    if is_float_tensor(node):
        unary(node, config)


def spatial_mean(node: Node) -> bool:
    """A mean over H and W of a 4-D tensor: global average pooling."""
    rank = node.args[0].meta["val"].dim()
    dims = node.args[1] if len(node.args) > 1 and node.args[1] is not None else []
    return rank == 4 and sorted(d % rank for d in ([dims] if isinstance(dims, int) else dims)) == [2, 3]


def _squares(node: Node) -> bool:
    """x * x or x ** 2."""
    if node.op != "call_function":
        return False
    if node.target == aten.mul.Tensor:
        return node.args[0] is node.args[1]
    return node.target == aten.pow.Tensor_Scalar and node.args[1] == 2


# A mean's scale over its input's: the range it can never leave, so wide that no sum of integers divides by a count
# below 2^17 to an exact tie (TOSA's RESCALE rounds ties up, torch to even: the program would leave the model).
MEAN_WIDENING = 1 + 2**-16


def _widened(observers) -> tuple[torch.Tensor, torch.Tensor]:
    scale, zero_point = observers[0].calculate_qparams()
    return (scale.double() * MEAN_WIDENING).to(torch.float32), zero_point


@annotates(aten.mean.dim, aten.mean.default)
def _mean(node: Node, config: QuantizationConfig) -> None:
    """Global average pooling shares its input's quantization (AVG_POOL2D rounds once). A mean of squares (an RMS
    or layer norm's variance) gets its own: it spans far less than the squares. Any other mean keeps its input's
    range (a range calibrated on a few samples would clip a first moment's), MEAN_WIDENING wider."""
    x, spec = node.args[0], config.input_activation
    if spatial_mean(node) or not is_float_tensor(node) or spec is None:
        _shared(node, config)
    elif _squares(x):
        unary(node, config)
    else:
        _mark(node, {x: spec}, DerivedQuantizationSpec(
            derived_from=[(x, node)], derive_qparams_fn=_widened, dtype=spec.dtype, quant_min=spec.quant_min,
            quant_max=spec.quant_max, qscheme=spec.qscheme))


@annotates(aten.argmax.default)
def _argmax(node: Node, config: QuantizationConfig) -> None:
    """Quantized input, integer index output (no output quantization)."""
    _mark(node, _act_inputs(config, node.args[0]))


# ------------------------------------------------------------------ rules: layers (matmul, resize, embedding, pools)

annotates(aten.matmul.default, aten.bmm.default, aten.mm.default)(_binary)  # both operands are activations
annotates(aten.upsample_nearest2d.vec, aten.upsample_bilinear2d.vec)(_shared)  # RESIZE keeps the scale
annotates(aten.embedding.default)(_shared)  # GATHER copies int8 rows of the (activation-quantized) table


@annotates(aten.adaptive_max_pool2d.default)
def _adaptive_max_pool(node: Node, config: QuantizationConfig) -> None:
    """The values (getitem 0) share the input's quantization; the indices stay integers."""
    _shared_items(node, config, only=0)


# ------------------------------------------------------------------ after the rules


def state_read_as_written(nodes: list[Node]) -> None:
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


def is_weight(node: Node, inp: Node) -> bool:
    """``inp`` is the weight operand of a convolution or linear ``node`` (a constant added or multiplied is an
    activation)."""
    return node.target in WEIGHT_OPS and len(node.args) > 1 and node.args[1] is inp
