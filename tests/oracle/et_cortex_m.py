"""ExecuTorch 1.5.1's Cortex-M backend as an oracle (run in the oracle venv by et_oracle.py's ``serve``; tosakit never
imports this file):

- ``cortex_m_op``: one ``cortex_m::`` operator's reference implementation (ExecuTorch's ``ops/operators.py``) on
  argument lists saved by torch.save; the results saved beside them.
- ``cortex_m_export``: its documented flow for a float model (channels-last, CortexMQuantizer, calibrated on the
  example inputs; to_edge_transform_and_lower with its edge config; CortexMPassManager for the target;
  to_executorch), or only its lowering when the job says the model is quantized. Written: the .pte, the quantized
  graph (.pt2), each cortex_m call with its non-tensor arguments and its constant tensors (.pt), and the lowered
  graph's outputs on the inputs by its reference kernels (.pt)."""

import re
from pathlib import Path


def _passes():
    import executorch.backends.cortex_m.passes.cortex_m_pass_manager as manager  # before ops.operators: import order

    import executorch.backends.cortex_m.ops.operators  # noqa: F401  (registers cortex_m::)
    return manager


def cortex_m_op(job: dict) -> dict:
    """{"op", "args" (.pt of a list of argument lists), "out" (.pt to write the results to)}."""
    import torch

    _passes()
    op = getattr(torch.ops.cortex_m, job["op"])
    torch.save([op(*args) for args in torch.load(job["args"])], job["out"])
    return {"out": job["out"]}


def cortex_m_schemas(job: dict) -> dict:
    """Each cortex_m operator's .out schema, as torch prints it with ExecuTorch's library loaded."""
    import torch

    _passes()
    found = {}
    for name in job["ops"]:
        found[name] = str(getattr(torch.ops.cortex_m, name).out._schema)
    return {"schemas": found}


def cortex_m_export(job: dict) -> dict:
    """{"name", "model" (.pt2), "inputs" (.pt), "target" (cortex-m55, ...) or "targets" (a list), "out" (folder),
    "quantized" (bool)}: the model quantized once, lowered for each target into its own folder. The result: the
    first target's files and calls, and every target's under "targets"."""
    import torch
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    _passes()
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    inputs = tuple(torch.load(job["inputs"]))
    module = torch.export.load(job["model"]).module(check_guards=False)
    if job.get("quantized"):
        quantized = torch.export.export(module, inputs)
    else:
        prepared = prepare_pt2e(module, CortexMQuantizer())
        prepared(*inputs)
        quantized = torch.export.export(convert_pt2e(prepared), inputs)
    torch.export.save(quantized, out / f"{job['name']}.quantized.pt2")
    targets = job.get("targets") or [job["target"]]
    lowered = {t: _lower(quantized, inputs, t, out / t if len(targets) > 1 else out, job["name"]) for t in targets}
    return {**lowered[targets[0]], "quantized": str(out / f"{job['name']}.quantized.pt2"), "targets": lowered}


def _lower(quantized, inputs: tuple, target: str, out: Path, name: str) -> dict:
    """One target's lowering of the quantized graph: the .pte, each cortex_m call, the constants it reads and the
    lowered graph's outputs by the reference kernels."""
    import torch
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.backends.cortex_m.target_config import CortexMTargetConfig
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    manager = _passes()
    out.mkdir(parents=True, exist_ok=True)
    edge = to_edge_transform_and_lower(quantized, compile_config=cortex_m_edge_compile_config())
    config = CortexMTargetConfig.from_target_string(target)
    edge._edge_programs["forward"] = manager.CortexMPassManager(edge.exported_program(),
                                                                target_config=config).transform()
    lowered = edge.exported_program()
    constants = {**lowered.state_dict, **lowered.constants}
    signature = lowered.graph_signature
    named = {**signature.inputs_to_parameters, **signature.inputs_to_buffers,
             **signature.inputs_to_lifted_tensor_constants}
    calls, tensors = [], {}

    def value(a):
        if isinstance(a, torch.fx.Node):
            if a.op == "placeholder" and a.name in named:
                tensors[a.name] = constants[named[a.name]]
                return {"constant": a.name}
            if "alloc" in str(a.target):
                (shape, _dtype) = a.args[0]  # memory.alloc(((size,), torch.uint8))
                return {"scratch": int(shape[0])}
            return {"node": a.name}
        if isinstance(a, (list, tuple)):
            return [value(x) for x in a]
        return a if isinstance(a, (int, float, bool, str, type(None))) else str(a)

    for n in lowered.graph.nodes:
        found = re.search(r"cortex_m\.(\w+)\.", str(n.target))  # <EdgeOpOverload: cortex_m.quantized_add.default>
        if n.op == "call_function" and found:
            calls.append({"op": found.group(1), "args": [value(a) for a in n.args]})
    torch.save(tensors, out / "constants.pt")
    reference = lowered.module()(*inputs)  # its reference kernels, before to_executorch swaps in .out forms
    torch.save(reference if isinstance(reference, (tuple, list)) else (reference,), out / "reference.pt")
    program = edge.to_executorch(config=ExecutorchBackendConfig(extract_delegate_segments=False))
    pte = out / f"{name}.pte"
    pte.write_bytes(program.buffer)
    return {"pte": str(pte), "calls": calls, "constants": str(out / "constants.pt"),
            "reference": str(out / "reference.pt")}
