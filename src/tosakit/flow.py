"""The whole flow in one call: export, quantize, partition, lower, emit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule

from .backends.ethosu import EthosUPartitioner
from .backends.vgf import VgfPartitioner
from .capture import export, own_state
from .errors import TosakitError
from .lower import TOSAPartitioner
from .program import EdgeProgramManager, ExecutorchProgramManager, to_edge_transform_and_lower
from .program.manager import ExecutorchBackendConfig
from .quantize import CortexMQuantizer, EthosUQuantizer, QuantizationConfig, TOSAQuantizer, VgfQuantizer
from .quantize.config import get_symmetric_quantization_config
from .targets import CORTEX_M_ISA
from .specs import ArmCompileSpec, CortexMCompileSpec, EthosUCompileSpec, VgfCompileSpec, compile_spec_for_target


def quantizer_for(spec: ArmCompileSpec) -> TOSAQuantizer:
    """The quantizer class that matches a compile spec."""
    cls = {EthosUCompileSpec: EthosUQuantizer, VgfCompileSpec: VgfQuantizer, CortexMCompileSpec: CortexMQuantizer}.get(
        type(spec), TOSAQuantizer)
    return cls(spec)


def partitioner_for(spec: ArmCompileSpec, additional_checks=None) -> TOSAPartitioner:
    """The partitioner class that matches a compile spec."""
    cls = {EthosUCompileSpec: EthosUPartitioner, VgfCompileSpec: VgfPartitioner}.get(type(spec), TOSAPartitioner)
    return cls(spec, additional_checks)


@dataclass
class Compiled:
    """Every stage's result: the fake-quantized model, the edge program, the .pte program, and the host's
    verification of it (when asked for)."""

    spec: ArmCompileSpec
    quantized: GraphModule | None
    edge: EdgeProgramManager
    program: ExecutorchProgramManager
    verification: object | None = None  # verify.report.VerifyReport


# Told each stage's name as it starts: "export", "quantize", "lower", "verify".
StageCallback = Callable[[str], None]


def channels_last(model: torch.nn.Module, example_inputs: tuple) -> tuple[torch.nn.Module, tuple]:
    """A copy of ``model`` and the inputs with every 4-D tensor channels-last (the user's model is left as it was)."""
    import copy

    def convert(x):
        return x.contiguous(memory_format=torch.channels_last) if isinstance(x, torch.Tensor) and x.dim() == 4 else x

    return copy.deepcopy(model).to(memory_format=torch.channels_last), tuple(convert(x) for x in example_inputs)


def quantize_model(model: torch.nn.Module, example_inputs: tuple, spec: ArmCompileSpec,
                   config: QuantizationConfig | None = None,
                   calibration: Iterable[tuple] | None = None,
                   module_configs: dict[str, QuantizationConfig] | None = None) -> GraphModule:
    """PT2E post-training quantization for ``spec``; calibrates on ``calibration`` or the example inputs.
    ``module_configs``: another config for the modules so named (and their children)."""
    if not spec.tosa_spec.support_integer():
        raise TosakitError(f"cannot quantize for {spec.target_name}: it has no integer TOSA profile",
                           "choose TOSA-1.0+INT, vgf or an Ethos-U target, or do not quantize")
    quantizer = quantizer_for(spec).set_global(config or get_symmetric_quantization_config(is_per_channel=True))
    for name, module_config in (module_configs or {}).items():
        quantizer.set_module_name(name, module_config)
    gm = own_state(export(model, example_inputs).module())
    with torch.no_grad():
        return quantizer.quantize_with_submodules(gm, list(calibration) if calibration else [example_inputs])


def compile(model: torch.nn.Module, example_inputs: tuple, target: str | ArmCompileSpec, *, quantize: bool = False,
            delegate: bool = True, config: QuantizationConfig | None = None,
            calibration: Iterable[tuple] | None = None, additional_checks=None,
            module_configs: dict[str, QuantizationConfig] | None = None, progress: StageCallback | None = None,
            verify_on: tuple | None = None, verify_layers: bool = False,
            backend_config: ExecutorchBackendConfig | None = None) -> Compiled:
    """Export ``model``, optionally quantize it, delegate what ``target`` runs, and emit the program. ``model``
    may be exported already (an ``ExportedProgram``, e.g. of a quantized graph compiled for several targets):
    it is then lowered as it is. ``progress`` is told each stage as it starts; with ``verify_on`` (inputs) the
    program is run on the host against float PyTorch and the fake-quantized model (per layer with
    ``verify_layers``); ``backend_config`` sets the program's options (e.g. constants in a .ptd)."""
    spec = target if isinstance(target, ArmCompileSpec) else compile_spec_for_target(target)
    step = progress or (lambda stage: None)
    direct = isinstance(spec, CortexMCompileSpec)
    if direct and not isinstance(model, ExportedProgram):  # CMSIS-NN reads feature maps channels-last
        model, example_inputs = channels_last(model, example_inputs)
    if isinstance(model, ExportedProgram):
        if quantize:
            raise TosakitError("an exported program cannot be quantized: it is lowered as it is",
                               "pass the model itself to quantize it, or its quantized graph exported")
        ep, quantized = model, None
    else:
        if not isinstance(model, GraphModule):  # exported modules refuse .eval(); they are already traced
            model = model.eval()
        step("export")
        quantized = None
        if quantize:
            step("quantize")
            quantized = quantize_model(model, example_inputs, spec, config, calibration, module_configs)
        ep = export(quantized if quantized is not None else model, example_inputs)
    partitioners = [partitioner_for(spec, additional_checks)] if delegate and not direct else []
    step("lower")
    fallback = CORTEX_M_ISA[spec.cortex_m_fallback] if spec.cortex_m_fallback and partitioners else None
    if direct or fallback:  # imported here: it registers the cortex_m operators with torch (as ExecuTorch does)
        from .backends.cortex_m.passes import pipeline as cortex_m_pipeline
    edge = to_edge_transform_and_lower(ep, partitioner=partitioners,
                                       cpu_passes=cortex_m_pipeline(fallback or spec.isa) if direct or fallback
                                       else None)
    compiled = Compiled(spec, quantized, edge, edge.to_executorch(backend_config))
    if verify_on is not None:
        from .verify.run import verify

        step("verify")
        compiled.verification = verify(edge, compiled.program, verify_on, model, quantized, layers=verify_layers)
    return compiled
