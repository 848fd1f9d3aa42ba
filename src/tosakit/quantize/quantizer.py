"""PT2E quantizers for TOSA targets: annotate an exported graph op by op.

Annotation rules are a table keyed by ATen overload (one small function per
op family). Which config applies to a node is decided by module name, then
module type, then the global config (``None`` leaves the node in float).
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import (
    QuantizationAnnotation,
    Quantizer,
    SharedQuantizationSpec,
)

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
    aten.adaptive_avg_pool2d.default,
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


@annotates(aten.conv1d.default, aten.conv2d.default, aten.conv2d.padding, aten.convolution.default, aten.linear.default)
def _conv(node: Node, config: QuantizationConfig) -> None:
    x, w = node.args[0], node.args[1]
    bias = node.args[2] if len(node.args) > 2 else None
    transposed = node.target == aten.convolution.default and node.args[6]
    inputs = _act_inputs(config, x)
    inputs[w] = config.weight_spec(1 if transposed else 0)
    if isinstance(bias, Node):
        inputs[bias] = config.bias_spec((x, node), (w, node))
    _mark(node, inputs)
    _finish_with_output(node, config)


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


# ------------------------------------------------------------------ rules: data movement and reductions


# ------------------------------------------------------------------ rules: layers (conv, matmul, pools, norms, attention, recurrent)


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

    def set_io(self, quantization_config: QuantizationConfig | None) -> "TOSAQuantizer":
        """Config for the model's input and output activations."""
        self.io_config = quantization_config
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
        """Prepare the graph for annotation: scalar operands become tensors."""
        return _scalar_to_tensor(model)

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
        if self.io_config is not None:
            self._annotate_io(model, self.io_config)
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
        seen = 0
        for sample in calibration_samples:
            prepared(*(sample if isinstance(sample, (tuple, list)) else (sample,)))
            seen += 1
        if seen == 0:
            raise TosakitError("quantize_with_submodules got no calibration samples",
                               "pass a non-empty list of input tuples")
        return convert_pt2e(prepared)


class EthosUQuantizer(TOSAQuantizer):
    """Quantizer for Ethos-U targets (integer only: everything must be quantized)."""

    def __init__(self, compile_spec: EthosUCompileSpec):
        super().__init__(require_spec(compile_spec, EthosUCompileSpec, "EthosUQuantizer"))


class VgfQuantizer(TOSAQuantizer):
    """Quantizer for VGF targets (partial quantization allowed)."""

    def __init__(self, compile_spec: VgfCompileSpec):
        super().__init__(require_spec(compile_spec, VgfCompileSpec, "VgfQuantizer"))

