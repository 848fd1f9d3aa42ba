"""The Ethos-U partitioner and backend: TOSA compiled by Vela into the delegate payload."""

from __future__ import annotations

import copy
import io

import numpy as np
from torch.fx.passes.operator_support import OperatorSupportBase

from ...capture import source_of
from ...errors import TosakitError
from ...lower import Case, LoweredGraph, TOSAPartitioner
from ...lower.lowering import computes_in_float
from ...lower.tosa_graph import is_float, isolate
from ...partition import PartitionResult
from ...partition.partitioner import extract_subgraph
from ...quantize.qdq import is_dequantize, is_quantize
from ...specs import ArmCompileSpec, EthosUCompileSpec, require_spec
from ..registry import PreprocessResult, backend, compile_lowered, form_choice, lower_for
from .payload import EthosUPayload, pack_payload, parse_payload, place_external
from .support import limits_for
from .vela import VelaRefusal, VelaReport, VelaResult, compile_tosa

REPORT_HINT = "report this model to tosakit"

__all__ = ["EthosUPartitioner", "EthosUPayload", "VelaReport", "VelaResult", "compile_tosa", "fastest_form",
           "pack_payload", "parse_payload"]


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
            f"{len(lowered.inputs)}/{len(lowered.outputs)}", REPORT_HINT)
    payload = pack_payload(result)
    processed, moved = place_external(payload, spec.external_block_placements.blocks())
    return PreprocessResult(processed, result.report,
                            {"tosa": lowered.tosa, "vela.npz": raw_npz(result),
                             "vela_summary.txt": result.report.summary().encode()}, moved, payload)


_FASTEST: dict[tuple, str] = {}


@form_choice("EthosUBackend")
def fastest_form(spec: EthosUCompileSpec):
    """Each lowering choice (a TRANSPOSE's form, a convolution stem's) in the form Vela estimates fastest
    for this NPU and memory system: each form compiled alone, ties to the first (plain) form."""

    def choose(case: Case) -> str:
        key = (tuple(spec.compiler_flags), case)
        if key not in _FASTEST:
            cycles = {}
            for form in case.forms:
                try:
                    cycles[form] = compile_tosa(case.candidate(form), spec).report.total_cycles
                except TosakitError:
                    continue  # a form this Vela refuses (or cannot fit) is not a candidate
            _FASTEST[key] = min(cycles, key=cycles.get, default=case.forms[0])
        return _FASTEST[key]

    return choose


def _refuse_float_program(gm, spec: EthosUCompileSpec) -> None:
    """Ethos-U runs integers only: a model that was never quantized is refused before lowering."""
    if any(is_quantize(n) or is_dequantize(n) for n in gm.graph.nodes):
        return  # quantized (a float op left between is reported, and runs on the CPU)
    node = next((n for n in gm.graph.nodes if n.op == "call_function" and computes_in_float(n)), None)
    if node is not None:
        raise TosakitError(
            f"node {node.name} ({node.target}{', ' + source_of(node) if source_of(node) else ''}) computes in "
            f"float, and {spec.target} runs integers only: the model is not quantized",
            "quantize it (--quantize; EthosUQuantizer with get_symmetric_quantization_config() or "
            "get_symmetric_a16w8_quantization_config()), or compile without --delegate to run it on the CPU, "
            "or choose the vgf or TOSA-1.0+FP target")


class EthosUPartitioner(TOSAPartitioner):
    """Partitions subgraphs the Ethos-U NPU runs (integers only, within Vela's limits).

    Each proposed partition is lowered and every TOSA operator checked against Vela's limits
    (``support.py``), then compiled by Vela; a node behind a refused operator stays on the CPU with
    the limit as its reason, and the rest is partitioned again. Never fails inside Vela.
    """

    MAX_ROUNDS = 8

    def __init__(self, compile_spec: EthosUCompileSpec, additional_checks: list[OperatorSupportBase] | None = None):
        super().__init__(require_spec(compile_spec, EthosUCompileSpec, "EthosUPartitioner"), additional_checks)
        self.limits = limits_for(compile_spec.target)
        self._refused: dict[str, str] = {}

    def target_reason(self, node) -> str | None:
        return self._refused.get(node.name)

    def partition(self, program) -> PartitionResult:
        _refuse_float_program(program.graph_module, self.compile_spec)
        self._refused = {}
        for _ in range(self.MAX_ROUNDS):
            result = super().partition(program)
            refused = self._validate(result)
            if not refused:
                return result
            self._refused.update(refused)
        raise TosakitError(f"partitioning for {self.compile_spec.target} did not settle after {self.MAX_ROUNDS} rounds",
                           REPORT_HINT)

    def _validate(self, result: PartitionResult) -> dict[str, str]:
        """Lower and compile each partition; the nodes Vela's limits (or Vela) refuse, with reasons."""
        refused: dict[str, str] = {}
        for tag in result.partition_tags:
            sub = extract_subgraph(result.graph_module, tag)
            lowered = lower_for(copy.deepcopy(sub.graph_module), self.compile_spec)
            for op in lowered.ops:
                why = self.limits.refusal(op)
                if why and op.location and op.location not in refused and not self._vela_accepts(op):
                    refused[op.location] = why
            if refused:
                continue
            try:
                result.prepared[tag] = compile_lowered(sub.graph_module, lowered, self.compile_spec)
            except VelaRefusal as exc:
                blamed = self._blame(lowered.ops, exc)
                if not blamed:
                    raise
                refused.update(blamed)
        return refused

    def _vela_accepts(self, op) -> bool:
        """Vela's word on one operator the limits table refuses (Vela sometimes legalizes beyond its report)."""
        try:
            compile_tosa(isolate(op), self.compile_spec)
        except TosakitError:
            return False
        return True

    def _blame(self, ops, exc: VelaRefusal) -> dict[str, str]:
        """Which of the operators Vela named it refuses: each compiled alone, the refused ones by node."""
        blamed = {}
        for op in ops:
            if op.op not in exc.tosa_ops or not op.location or op.location in blamed:
                continue
            try:
                compile_tosa(isolate(op), self.compile_spec)
            except VelaRefusal as alone:
                reasons = [ln.strip(" -") for ln in alone.detail.splitlines() if ln.strip().startswith("-")]
                blamed[op.location] = f"Vela refused TOSA {op.op}: {reasons[-1] if reasons else alone.message}"
        return blamed
