"""Compile exported models with ExecuTorch 1.5.1's Arm backend, for side-by-side figures.

Runs in the side environment `make bench` builds (`executorch==1.5.1`, the same torch, torchao,
Vela and TOSA tools as tosakit); tosakit itself never imports executorch. For each job it follows
ExecuTorch's Ethos-U tutorial — EthosUQuantizer, prepare/calibrate/convert, EthosUPartitioner,
to_executorch, write the .pte — timing the whole flow, and keeps each delegate's TOSA (ExecuTorch's
intermediate artifacts) so bench/run.py measures it with the same Vela run as tosakit's.

    python executorch_side.py JOBS.json RESULTS.json
JOBS.json: [{"name", "model" (.pt2 from torch.export.save), "inputs" (torch.save'd tuple), "target",
"memory_mode", "out" (a folder), optional "config": "int8" (default) or "a8w4" (ExecuTorch's
get_symmetric_a8w4_quantization_config, post-training: is_qat=False)}]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from executorch.backends.arm.ethosu import EthosUCompileSpec, EthosUPartitioner
from executorch.backends.arm.quantizer import EthosUQuantizer, get_symmetric_quantization_config
from executorch.backends.arm.quantizer.arm_quantizer import get_symmetric_a8w4_quantization_config
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

_BOUNDARY = ("quantize_per_tensor", "dequantize_per_tensor", "executorch_call_delegate", "getitem")


def compile_job(job: dict) -> dict:
    """One model for one target through ExecuTorch's Arm flow; the figures bench/run.py needs."""
    module = torch.export.load(job["model"]).module()
    inputs = torch.load(job["inputs"])
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("output_*.tosa"):
        old.unlink()
    start = time.perf_counter()
    spec = EthosUCompileSpec(job["target"], memory_mode=job["memory_mode"])
    spec.dump_intermediate_artifacts_to(str(out))
    quantizer = EthosUQuantizer(spec)
    configs = {"int8": lambda: get_symmetric_quantization_config(is_per_channel=True),
               "a8w4": lambda: get_symmetric_a8w4_quantization_config(is_per_channel=True, is_qat=False)}
    quantizer.set_global(configs[job.get("config", "int8")]())
    prepared = prepare_pt2e(torch.export.export(module, inputs).module(), quantizer)
    prepared(*inputs)
    quantized = torch.export.export(convert_pt2e(prepared), inputs)
    edge = to_edge_transform_and_lower(quantized, partitioner=[EthosUPartitioner(spec)])
    cpu = sorted(str(n.target) for n in edge.exported_program().graph.nodes if n.op == "call_function"
                 and not any(b in str(n.target) for b in _BOUNDARY))
    program = edge.to_executorch(config=ExecutorchBackendConfig(extract_delegate_segments=False))
    (out / f"{job['name']}.pte").write_bytes(program.buffer)
    seconds = time.perf_counter() - start
    return {"name": job["name"], "target": job["target"], "config": job.get("config", "int8"), "seconds": seconds,
            "tosa": sorted(str(p) for p in out.glob("output_*.tosa")), "cpu_ops": cpu,
            "vela_flags": list(spec.compiler_flags)}


def cortex_m_job(job: dict) -> dict:
    """One model through ExecuTorch's Cortex-M flow (CortexMQuantizer, its edge config and pass manager)."""
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer
    from executorch.backends.cortex_m.target_config import CortexMTargetConfig

    module = torch.export.load(job["model"]).module(check_guards=False)
    inputs = torch.load(job["inputs"])
    out = Path(job["out"])
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    prepared = prepare_pt2e(module, CortexMQuantizer())
    prepared(*inputs)
    quantized = torch.export.export(convert_pt2e(prepared), inputs)
    edge = to_edge_transform_and_lower(quantized, compile_config=cortex_m_edge_compile_config())
    manager = CortexMPassManager(edge.exported_program(), target_config=CortexMTargetConfig.from_target_string(
        job["target"]))
    edge._edge_programs["forward"] = manager.transform()
    program = edge.to_executorch(config=ExecutorchBackendConfig(extract_delegate_segments=False))
    seconds = time.perf_counter() - start
    (out / f"{job['name']}.pte").write_bytes(program.buffer)
    return {"name": job["name"], "target": job["target"], "seconds": seconds, "pte": str(out / f"{job['name']}.pte")}


def main(argv: list[str]) -> int:
    jobs = json.loads(Path(argv[0]).read_text())
    results = []
    for job in jobs:
        try:
            results.append(cortex_m_job(job) if job["target"].startswith("cortex-m") else compile_job(job))
        except Exception as exc:  # one model ExecuTorch cannot compile must not hide the others
            results.append({"name": job["name"], "target": job["target"], "error": f"{type(exc).__name__}: {exc}"})
        print(f"  executorch: {job['name']} for {job['target']}: "
              f"{results[-1].get('error') or '%.1f s' % results[-1]['seconds']}", file=sys.stderr, flush=True)
    Path(argv[1]).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
