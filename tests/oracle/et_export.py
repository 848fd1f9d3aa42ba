"""Ethos-U .pte files made by ExecuTorch 1.5.1's own Arm backend: ``export_job``, run in the oracle venv by
et_oracle.py's ``serve`` (command "export_ethosu": one process with executorch imported for many exports);
tosakit never imports this file. A job: {"name", "model" (.pt2 saved by torch.export.save), "inputs" (a tuple
of tensors saved by torch.save), "target" (e.g. ethos-u55-128), "memory_mode" (or null: ExecuTorch's
default), "out" (a folder), "quantized" (optional: true when the model is already quantized)}.

Each job follows ExecuTorch's Ethos-U tutorial: EthosUQuantizer with
get_symmetric_quantization_config(is_per_channel=True), prepare_pt2e, calibrate on the example inputs,
convert_pt2e, EthosUPartitioner, to_executorch. A "quantized" job's model is a quantized graph already
(convert_pt2e's, exported; e.g. tosakit's): it is only lowered (EthosUPartitioner, to_executorch), so that
both compilers lower one quantized graph. Written into the job's folder:

  NAME.pte               the program (delegate payloads inline, as ExecuTorch's tutorial writes it)
  NAME.quantized.pt2     the quantized graph it lowered (convert_pt2e, exported), for tosakit to lower too
  output_<tag>_*.tosa    each delegate's TOSA (the compile spec's dump_intermediate_artifacts_to)
  TAG.ptd                with "external_blocks" (a tag): Vela's cmd_data and weight_data blocks, placed outside
                         the payload (VelaExternalBlockPlacements)
  NAME.bpte              with "bundleio": the program bundled as aot_arm_compiler --bundleio bundles it: one
                         test case of the example inputs, its expected outputs the converted (fake-quantized)
                         model's, or the float model's when the job's model is quantized already

The result: {"name", "pte", "quantized", "delegates": [{"backend", "tosa", "payload_sha256"} in call order],
"cpu_ops", "vela_flags", "seconds"}. A "vgf" target follows ExecuTorch's VGF tutorial the same way (VgfQuantizer,
VgfPartitioner), its model converter the one the job names ("model_converter").
"""

import hashlib
import time
from pathlib import Path


def export_job(job: dict) -> dict:
    """One job: the .pte, the quantized graph and each delegate's TOSA written; what was made."""
    import os

    import torch
    from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner, VelaExternalBlockPlacements
    from executorch.backends.arm.quantizer import EthosUQuantizer, VgfQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
    from executorch.backends.arm.tosa.backend import arm_get_first_delegation_tag
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.lowered_backend_module import LoweredBackendModule
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("output_*.tosa"):
        old.unlink()
    module = torch.export.load(job["model"]).module(check_guards=False)
    inputs = tuple(torch.load(job["inputs"]))
    start = time.perf_counter()
    if job["target"] == "vgf":  # ExecuTorch's VGF flow, with the model converter tosakit's venv has
        os.environ["MODEL_CONVERTER_PATH"] = job["model_converter"]
        spec, partitioner, quantizer_class = VgfCompileSpec(), VgfPartitioner, VgfQuantizer
    else:
        tag = job.get("external_blocks")
        placements = VelaExternalBlockPlacements(cmd_data=tag, weight_data=tag) if tag else None
        spec = EthosUCompileSpec(job["target"], memory_mode=job.get("memory_mode"),
                                 external_block_placements=placements)
        partitioner, quantizer_class = EthosUPartitioner, EthosUQuantizer
    spec.dump_intermediate_artifacts_to(str(out))
    reference = module
    if job.get("quantized"):
        quantized = torch.export.export(module, inputs)
    else:
        quantizer = quantizer_class(spec)
        quantizer.set_global(get_symmetric_quantization_config(is_per_channel=True))
        # check_guards=False as ExecuTorch's own Arm flow tests do: torch 2.13's guard-check submodule
        # (a call_module node) stops the quantizer's passes ("call_module is not supported")
        prepared = prepare_pt2e(torch.export.export(module, inputs).module(check_guards=False), quantizer)
        prepared(*inputs)  # calibrate on the example inputs
        converted = convert_pt2e(prepared)
        reference = converted
        quantized = torch.export.export(converted, inputs)
    torch.export.save(quantized, out / f"{job['name']}.quantized.pt2")
    edge = to_edge_transform_and_lower(quantized, partitioner=[partitioner(spec)])
    graph = edge.exported_program().graph_module
    delegates = []
    for node in graph.graph.nodes:  # in call order: the program's delegate order
        if node.op == "call_function" and "executorch_call_delegate" in str(node.target):
            lowered = getattr(graph, node.args[0].target)
            assert isinstance(lowered, LoweredBackendModule), type(lowered)
            tag = arm_get_first_delegation_tag(lowered.original_module.graph_module)
            [tosa] = out.glob(f"output_{tag}_*.tosa") if tag else out.glob("output_TOSA*.tosa")
            delegates.append({"backend": lowered.backend_id, "tosa": str(tosa),
                              "payload_sha256": hashlib.sha256(lowered.processed_bytes).hexdigest()})
    cpu = sorted(str(n.target) for n in graph.graph.nodes if n.op == "call_function"
                 and "executorch_call_delegate" not in str(n.target) and "getitem" not in str(n.target))
    program = edge.to_executorch(config=ExecutorchBackendConfig(extract_delegate_segments=False))
    pte = out / f"{job['name']}.pte"
    pte.write_bytes(program.buffer)
    if job.get("external_blocks"):
        program.write_tensor_data_to_file(str(out))
    if job.get("bundleio"):
        _bundle(program, reference, inputs, out / f"{job['name']}.bpte")
    return {"name": job["name"], "pte": str(pte), "quantized": str(out / f"{job['name']}.quantized.pt2"),
            "delegates": delegates, "cpu_ops": cpu, "vela_flags": list(getattr(spec, "compiler_flags", [])),
            "seconds": time.perf_counter() - start}



def _bundle(program, reference, inputs: tuple, path: Path) -> None:
    """``program`` bundled with one test case, as aot_arm_compiler --bundleio writes it."""
    import torch
    from executorch.devtools import BundledProgram
    from executorch.devtools.bundled_program.config import MethodTestCase, MethodTestSuite
    from executorch.devtools.bundled_program.serialize import serialize_from_bundled_program_to_flatbuffer

    with torch.no_grad():
        expected = reference(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    case = MethodTestCase(inputs=list(inputs), expected_outputs=expected)
    bundled = BundledProgram(program, [MethodTestSuite(method_name="forward", test_cases=[case])])
    path.write_bytes(serialize_from_bundled_program_to_flatbuffer(bundled))
