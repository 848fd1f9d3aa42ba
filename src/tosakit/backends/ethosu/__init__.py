"""EthosUBackend: TOSA compiled by Vela into the Ethos-U delegate payload."""

from __future__ import annotations

import io

import numpy as np
from torch.fx.passes.operator_support import OperatorSupportBase

from ...errors import TosakitError
from ...lower import LoweredGraph, TOSAPartitioner
from ...lower.tosa_graph import is_float
from ...specs import ArmCompileSpec, EthosUCompileSpec, require_spec
from .. import PreprocessResult, backend
from .payload import EthosUPayload, pack_payload, parse_payload
from .vela import VelaReport, VelaResult, compile_tosa

__all__ = ["EthosUPartitioner", "EthosUPayload", "VelaReport", "VelaResult", "compile_tosa", "pack_payload",
           "parse_payload"]


def raw_npz(result: VelaResult) -> bytes:
    """Vela's ``--output-format raw`` file for the same compile (kept with -i)."""
    arrays = {
        "cmd_data": np.array(result.cmd_data, dtype=bytes),
        "weight_data": np.array(result.weight_data, dtype=bytes),
        "scratch_size": np.int64(result.scratch_size),
        "scratch_fast_size": np.int64(result.fast_scratch_size),
    }
    for kind, tensors in (("input", result.inputs), ("output", result.outputs)):
        arrays[f"{kind}_shape"] = np.array([t.shape for t in tensors], dtype=np.int64)
        arrays[f"{kind}_elem_size"] = np.array([t.elem_size for t in tensors], dtype=np.int64)
        arrays[f"{kind}_region"] = np.array([t.region for t in tensors], dtype=np.int64)
        arrays[f"{kind}_offset"] = np.array([t.offset for t in tensors], dtype=np.int64)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


@backend("EthosUBackend")
def preprocess(lowered: LoweredGraph, spec: ArmCompileSpec) -> PreprocessResult:
    """Compile with Vela; the payload is the block stream the Ethos-U runtime reads."""
    require_spec(spec, EthosUCompileSpec, "EthosUBackend")
    for v in [*lowered.inputs, *lowered.outputs]:
        if is_float(v.dtype):
            raise TosakitError(f"delegate tensor {v.name} is float; Ethos-U delegates take integer I/O only",
                               "quantize the model (EthosUQuantizer / --quantize)")
    result = compile_tosa(lowered.tosa, spec)
    if (len(result.inputs), len(result.outputs)) != (len(lowered.inputs), len(lowered.outputs)):
        raise TosakitError(
            f"Vela changed the delegate's I/O: {len(result.inputs)}/{len(result.outputs)} tensors for a graph with "
            f"{len(lowered.inputs)}/{len(lowered.outputs)}", "report this model to tosakit")
    return PreprocessResult(pack_payload(result), result.report,
                            {"tosa": lowered.tosa, "vela.npz": raw_npz(result),
                             "vela_summary.txt": result.report.summary().encode()})


class EthosUPartitioner(TOSAPartitioner):
    """Partitions subgraphs the Ethos-U NPU runs (integers only)."""

    def __init__(self, compile_spec: EthosUCompileSpec, additional_checks: list[OperatorSupportBase] | None = None):
        super().__init__(require_spec(compile_spec, EthosUCompileSpec, "EthosUPartitioner"), additional_checks)
