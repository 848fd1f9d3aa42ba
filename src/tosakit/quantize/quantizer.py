"""PT2E quantizers for TOSA targets: annotate an exported graph op by op.

Which config applies to a node is decided by module name, then module type, then the global config (``None``
leaves the node in float); the rules of ``annotate`` then mark its inputs and output.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.quantizer import FixedQParamsQuantizationSpec, Quantizer, SharedQuantizationSpec

from ..errors import TosakitError
from ..specs import (ArmCompileSpec, CortexMCompileSpec, EthosUCompileSpec, TosaSpecification, VgfCompileSpec,
                     require_spec)
from .annotate import (ANNOTATION_KEY, ANNOTATORS, CONFIG_KEY, is_annotated, is_float_tensor, is_weight,
                       state_read_as_written)
from .calibration import calibrate
from .config import QuantizationConfig, get_symmetric_quantization_config
from .rewrites import annotation_pipeline


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

    KEEP_WHOLE: frozenset = frozenset()  # composite ops a kernel of the target computes whole

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """Prepare the graph for annotation: constants folded, in-place ops functional, scalar operands tensors."""
        for rewrite in annotation_pipeline(self.config_for, self.KEEP_WHOLE):
            model = rewrite(model)
        return model

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
            if ann is not None and not is_float_tensor(node) and not isinstance(node.meta.get("val"), (tuple, list)):
                ann.output_qspec = None
        if self.io_config is not None:
            self._annotate_io(model, self.io_config)
        state_read_as_written(nodes)
        return model

    def _annotate_io(self, model: GraphModule, config: QuantizationConfig) -> None:
        for node in model.graph.nodes:
            if node.op == "placeholder" and is_float_tensor(node):
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
                    is_weight(node, inp) else self.ACTIVATIONS + (torch.int32,)
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


class CortexMQuantizer(TOSAQuantizer):
    """Quantizer for the direct Cortex-M flow, as ExecuTorch's: linear layers with one weight scale (CMSIS-NN's
    fully connected takes one), and a softmax kept whole with CMSIS-NN's fixed output (scale 1/256, zero point
    -128)."""

    KEEP_WHOLE = frozenset({torch.ops.aten.softmax.int, torch.ops.aten._softmax.default})
    EXTREMA = frozenset({torch.ops.aten.minimum.default, torch.ops.aten.maximum.default})
    SOFTMAX_OUTPUT = FixedQParamsQuantizationSpec(torch.int8, 1 / 256, -128, -128, 127, torch.per_tensor_affine)

    def __init__(self, compile_spec: CortexMCompileSpec | None = None):
        super().__init__(require_spec(compile_spec or CortexMCompileSpec(), CortexMCompileSpec, "CortexMQuantizer"))
        self.set_module_type(torch.nn.Linear, get_symmetric_quantization_config(is_per_channel=False))

    def annotate(self, model: GraphModule) -> GraphModule:
        """The annotations, the softmax output fixed; a minimum's or maximum's operands and result share one
        quantization (CMSIS-NN compares the integers)."""
        super().annotate(model)
        for node in model.graph.nodes:
            ann = node.meta.get(ANNOTATION_KEY)
            if node.target in self.KEEP_WHOLE and ann is not None and ann.output_qspec is not None:
                ann.output_qspec = self.SOFTMAX_OUTPUT
            if node.target in self.EXTREMA and ann is not None and len(ann.input_qspec_map) == 2:
                first, second = ann.input_qspec_map
                ann.input_qspec_map[second] = ann.output_qspec = SharedQuantizationSpec((first, node))
        return model
