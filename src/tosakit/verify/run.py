"""``--verify``: the lowered program run on the host against float PyTorch and the fake-quantized model, per
output and (``layers``) per layer and per NPU operation, so a person sees at once where accuracy is lost."""

from __future__ import annotations

import torch
from torch.fx import GraphModule

from ..errors import TosakitError
from ..program import EdgeProgramManager, ExecutorchProgramManager, LoweredBackendModule, tosa_key
from ..runtime.delegates import evaluate_exact
from ..runtime.profile import program_profile
from ..runtime.program import LoadedProgram
from .float_graph import float_reference
from .layers import delegate_reports
from .report import Agreement, OutputReport, VerifyReport


def verify(edge: EdgeProgramManager, program: ExecutorchProgramManager, inputs: tuple,
           float_model: torch.nn.Module | None = None, fake_quant: GraphModule | None = None,
           layers: bool = False) -> VerifyReport:
    """Run the emitted program on the host (Ethos-U delegates on the NPU simulator, VGF delegates on the VGF engine
    when this machine has it, each also on its TOSA to compare) and compare it with float PyTorch and the fake-quantized model (``convert_pt2e`` output,
    evaluated exactly: see ``ExactInterpreter``)."""
    tosa = {tosa_key(m.processed_bytes): m.tosa for m in edge.program.graph_module.children()
            if isinstance(m, LoweredBackendModule)}
    loaded = LoadedProgram(program.buffer, "the lowered program", tosa, isolate=False, named_data=program.data_map())
    engines, npu_error = [], None
    layout = loaded.layouts["forward"]
    if layout.delegate_npu or layout.delegate_vgf:  # each one carries its TOSA here
        try:
            got, engines = loaded.run_and_compare(list(inputs))
        except TosakitError as exc:  # a finding to show, not a reason to refuse the program: verify its TOSA
            npu_error = exc.message
            got = LoadedProgram(program.buffer, "the lowered program", tosa, isolate=False, engine="tosa",
                                named_data=program.data_map()).run(list(inputs))
    else:
        got = loaded.run(list(inputs))
    with torch.no_grad():
        floats = _as_tuple(float_model(*inputs)) if float_model is not None else None
    fakes = evaluate_exact(fake_quant, *inputs) if fake_quant is not None else None
    outputs = []
    for i, g in enumerate(got):
        outputs.append(OutputReport(
            i, tuple(g.shape),
            Agreement.of(g, floats[i]) if floats is not None and _same_kind(g, floats[i]) else None,
            Agreement.of(g, fakes[i]) if fakes is not None and _same_kind(g, fakes[i]) else None,
        ))
    float_ref = (float_reference(float_model, inputs, quantized=fake_quant is not None)
                 if (layers and float_model is not None) else None)
    rows, quantized_inputs, npu_ops = delegate_reports(edge, inputs, float_ref, layers,
                                                       npu=bool(engines) or bool(npu_error))
    profile = None
    if layout.delegate_npu and npu_error is None:  # where the time goes on the device, estimated
        profile = program_profile(loaded.plan(), loaded.run_profiled(list(inputs))[1])
    return VerifyReport(outputs, rows, quantized_inputs, engines, npu_error, npu_ops, profile)


def _same_kind(got: torch.Tensor, ref) -> bool:
    """Comparable outputs: both float, or both integer (an --int8-io program's integers are not the float
    model's values)."""
    return isinstance(ref, torch.Tensor) and got.is_floating_point() == ref.is_floating_point()


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)
