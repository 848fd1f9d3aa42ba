"""The program managers: partitions lowered into delegates, then written as an ExecuTorch program (.pte).

The entry points keep ExecuTorch's names: ``to_edge_transform_and_lower``,
``EdgeProgramManager.to_executorch``, ``ExecutorchProgramManager.write_to_file``,
``save_pte_program``.
"""

from __future__ import annotations

import functools
import operator
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule
from torch.fx.passes.tools_common import legalize_graph

from ..backends import PreparedDelegate, prepare_delegate
from ..capture import PRESERVED_OPS, CapturedProgram, capture
from ..errors import TosakitError, write_atomic
from ..lower import int32_ids, prepare_program, quantized_io
from ..lower.passes import run as run_passes
from ..lower.tosa_graph import DType
from ..partition import NodePlacement
from ..partition.partitioner import TAG_KEY, extract_subgraph, note_cpu_kernels
from ..specs import CompileSpec
from .decompose import decompose_for_runtime
from .emit import DEFAULT_CONSTANTS_TAG, EmittedProgram, executorch_call_delegate, program_from_graph
from .ptd import NamedBlob, serialize_ptd
from .pte import deserialize_pte, serialize_pte, tosa_key

__all__ = [
    "EdgeCompileConfig",
    "ExecutorchBackendConfig",
    "LoweredBackendModule",
    "EdgeProgramManager",
    "ExecutorchProgramManager",
    "to_edge",
    "to_edge_transform_and_lower",
    "save_pte_program",
    "serialize_pte",
    "deserialize_pte",
]


@dataclass
class EdgeCompileConfig:
    """Accepted for compatibility; tosakit always checks its own IR."""

    _check_ir_validity: bool = True
    _skip_dim_order: bool = False


@dataclass
class ExecutorchBackendConfig:
    """Program options; Arm delegates are always stored inline, as their runtimes expect. ``external_constants``
    moves the CPU kernels' constant tensors to a named-data file (``<tag>.ptd``; True: ExecuTorch's default tag),
    where the program names them by their graph names."""

    extract_delegate_segments: bool = False
    segment_alignment: int = 128
    external_constants: bool | str = False

    @property
    def constants_tag(self) -> str | None:
        if self.external_constants is True:
            return DEFAULT_CONSTANTS_TAG
        return self.external_constants or None


class LoweredBackendModule(torch.nn.Module):
    """A delegate: backend id, processed payload, compile specs, and the graph it replaces."""

    def __init__(self, backend_id: str, processed_bytes: bytes, compile_specs: list[CompileSpec],
                 original_module: GraphModule, tosa: bytes, tosa_spec, report=None, op_count=None,
                 named_data=None, input_orders=(), output_orders=()):
        super().__init__()
        self.tosa_spec = tosa_spec
        self.backend_id = backend_id
        self.processed_bytes = processed_bytes
        self.compile_specs = compile_specs
        self.original_module = original_module
        self.tosa = tosa
        self.report = report
        self.op_count = op_count or {}
        self.named_data: dict[str, bytes] = named_data or {}
        self.external_data: dict[str, dict[str, NamedBlob]] = {}  # .ptd tag -> key -> blocks placed outside
        self.stored_bytes = processed_bytes  # as the program stores it: placed blocks replaced by their keys
        self.input_orders: list[tuple[int, ...]] = list(input_orders)  # each TOSA input's dims, as torch dims
        self.output_orders: list[tuple[int, ...]] = list(output_orders)

    def forward(self, *args):
        """Run the replaced graph in PyTorch (float or fake-quantized reference semantics)."""
        out = self.original_module(*args)
        return out if isinstance(out, tuple) else (out,)


@dataclass
class DelegateInfo:
    """What one delegate holds, for reports."""

    name: str
    backend_id: str
    target: str
    node_count: int
    tosa_ops: dict[str, int]
    payload_bytes: int
    report: object | None = None
    seconds: float = 0.0


@dataclass
class EdgeProgramManager:
    """The program after partitioning and lowering: a graph of CPU ops and delegate calls."""

    program: CapturedProgram
    placements: list[NodePlacement] = field(default_factory=list)
    delegates: list[DelegateInfo] = field(default_factory=list)

    def exported_program(self, method_name: str = "forward") -> CapturedProgram:
        """The lowered graph (``.graph_module``, ``.graph``); printing shows every call."""
        return self.program

    @property
    def io_quantization(self) -> dict | None:
        """With integer I/O: the quantization of each input and output (None where it stayed float)."""
        return self.program.graph_module.meta.get("io_quantization")

    def __setattr__(self, name, value):
        # the seed's ``edge.exported_program = to_backend(edge.exported_program, partitioner)`` replaces the
        # program; the method stays a method
        if name == "exported_program" and isinstance(value, CapturedProgram):
            name = "program"
        super().__setattr__(name, value)

    def to_backend(self, partitioner) -> "EdgeProgramManager":
        """Partition and lower with one more partitioner."""
        for p in partitioner if isinstance(partitioner, (list, tuple)) else [partitioner]:
            _apply_partitioner(self, p)
        decompose_for_runtime(self.program.graph_module, self.placements)
        return self

    def to_executorch(self, config: ExecutorchBackendConfig | None = None) -> "ExecutorchProgramManager":
        """Emit the .pte program."""
        tag = (config or ExecutorchBackendConfig()).constants_tag
        emitted = program_from_graph(self.program.graph_module, self.program.in_spec, self.program.out_spec, tag)
        return ExecutorchProgramManager(self, emitted)


class ExecutorchProgramManager:
    """The final program: ``.buffer`` holds the .pte bytes."""

    def __init__(self, edge: EdgeProgramManager, emitted: EmittedProgram):
        self._edge = edge
        self.emitted = emitted
        self._buffer: bytes | None = None

    @property
    def executorch_program(self):
        return self.emitted.program

    @property
    def buffer(self) -> bytes:
        if self._buffer is None:
            self._buffer = serialize_pte(self.emitted.program, self.emitted.segments)
        return self._buffer

    def exported_program(self, method_name: str = "forward") -> CapturedProgram:
        return self._edge.exported_program(method_name)

    def write_to_file(self, open_file) -> None:
        """Write the .pte bytes to an open binary file."""
        open_file.write(self.buffer)

    def save(self, path: str | Path) -> Path:
        """Write the .pte to ``path`` atomically (temp file, then rename)."""
        return write_atomic(path, self.buffer)

    def data_map(self) -> dict[str, NamedBlob]:
        """Every entry of the program's named-data files, by key (what ``tosakit run --data`` reads)."""
        return {key: blob for entries in self.emitted.external.values() for key, blob in entries.items()}

    @property
    def _tensor_data(self) -> dict[str, bytes]:
        """Each named-data file's bytes, by tag (``<tag>.ptd``)."""
        return {tag: serialize_ptd(entries) for tag, entries in self.emitted.external.items()}

    def write_tensor_data_to_file(self, outdir: str | Path) -> list[Path]:
        """Write each named-data file (``<tag>.ptd``) into ``outdir``; the paths written."""
        return [write_atomic(Path(outdir) / f"{tag}.ptd", data) for tag, data in self._tensor_data.items()]


def save_pte_program(prog: ExecutorchProgramManager, model_name: str, output_dir: str = "") -> str:
    """Save ``prog`` as ``<output_dir>/<model_name>.pte``; returns the path."""
    name = model_name if model_name.endswith(".pte") else model_name + ".pte"
    path = Path(output_dir) / name if output_dir else Path(name)
    return str(prog.save(path))


def _preserved(partitioners) -> tuple:
    ops = set(PRESERVED_OPS)
    for p in partitioners:
        if hasattr(p, "ops_to_not_decompose"):
            ops.update(p.ops_to_not_decompose(None)[0])
    return tuple(ops)


def to_edge(program: ExportedProgram, compile_config: EdgeCompileConfig | None = None) -> EdgeProgramManager:
    """Core ATen with constants inlined; no delegates yet."""
    captured = capture(program)
    captured.graph_module = prepare_program(captured.graph_module)
    edge = EdgeProgramManager(captured, _cpu_placements(captured.graph_module))
    decompose_for_runtime(captured.graph_module, edge.placements)
    return edge


def to_backend(program, partitioner) -> CapturedProgram:
    """ExecuTorch's ``backend_api.to_backend(program, partitioner)``: lower what ``partitioner`` takes from
    ``program`` (an ``EdgeProgramManager``, its ``exported_program``, or an ``ExportedProgram``) and return
    the lowered program. A manager given (or owning the program given) is lowered in place, so the seed's
    ``edge.exported_program = to_backend(edge.exported_program, ArmPartitioner(spec))`` works as written."""
    owner = getattr(program, "__self__", None)  # the bound method ``edge.exported_program``
    edge = program if isinstance(program, EdgeProgramManager) else owner if isinstance(owner, EdgeProgramManager) \
        else None
    if edge is None:
        if isinstance(program, CapturedProgram):
            edge = EdgeProgramManager(program, _cpu_placements(program.graph_module))
        elif isinstance(program, ExportedProgram):
            edge = to_edge(program)
        else:
            raise TosakitError(f"to_backend takes an EdgeProgramManager or an ExportedProgram, not "
                               f"{type(program).__name__}",
                               "pass to_edge(torch.export.export(model, inputs)) or its exported_program")
    return edge.to_backend(partitioner).program


def to_edge_transform_and_lower(programs, partitioner: Sequence | None = None, transform_passes=None,
                                constant_methods=None, compile_config: EdgeCompileConfig | None = None,
                                generate_etrecord: bool = False, cpu_passes=None) -> EdgeProgramManager:
    """Decompose, partition with each partitioner in turn, lower every partition to its backend; ``cpu_passes``
    then rewrite what stays on the CPU (the Cortex-M kernels' patterns)."""
    if isinstance(programs, dict):
        if set(programs) != {"forward"}:
            raise TosakitError(f"methods {sorted(programs)} given; tosakit writes one method, 'forward'",
                               "pass a single ExportedProgram")
        programs = programs["forward"]
    partitioners = list(partitioner) if isinstance(partitioner, (list, tuple)) else ([partitioner] if partitioner else [])
    captured = capture(programs, _preserved(partitioners))
    gm = prepare_program(captured.graph_module)
    if any(getattr(getattr(p, "compile_spec", None), "preserve_io_quantization", False) for p in partitioners):
        gm = run_passes([quantized_io], gm)
    for spec in dict.fromkeys(p.compile_spec.tosa_spec for p in partitioners if hasattr(p, "compile_spec")):
        gm = run_passes([functools.partial(int32_ids, spec=spec)], gm)  # a delegate's GATHER takes int32 ids
    for p in transform_passes or []:
        gm = p(gm) or gm
    captured.graph_module = gm
    edge = EdgeProgramManager(captured)
    for p in partitioners:
        _apply_partitioner(edge, p)
    if not partitioners:
        edge.placements = _cpu_placements(gm)
    for p in cpu_passes or []:
        edge.program.graph_module = p(edge.program.graph_module) or edge.program.graph_module
    if cpu_passes:
        edge.placements = note_cpu_kernels(edge.program.graph_module, edge.placements)
    decompose_for_runtime(edge.program.graph_module, edge.placements)
    return edge


def _cpu_placements(gm: GraphModule) -> list[NodePlacement]:
    return [NodePlacement(n.name, str(n.target), "cpu", None, "no delegation requested (no partitioner)") for n in gm.graph.nodes
            if n.op == "call_function" and n.target is not operator.getitem]


def _apply_partitioner(edge: EdgeProgramManager, partitioner) -> None:
    result = partitioner.partition(edge.program)
    gm = result.graph_module
    placed = {p.node: p for p in edge.placements}
    for p in result.placements:
        if p.node not in placed or placed[p.node].placement == "cpu":
            placed[p.node] = p
    for tag, dspec in result.partition_tags.items():
        info = _fuse(gm, tag, partitioner.compile_spec, len(edge.delegates), result.prepared.get(tag))
        for p in placed.values():
            if p.tag == tag:
                p.tag = info.name
        edge.delegates.append(info)
    edge.placements = list(placed.values())
    for n in gm.graph.nodes:
        n.meta.pop(TAG_KEY, None)
    legalize_graph(gm)
    gm.graph.eliminate_dead_code()
    gm.recompile()


def _fuse(gm: GraphModule, tag: str, spec, index: int, prepared: PreparedDelegate | None = None) -> DelegateInfo:
    """Replace the nodes tagged ``tag`` with one call of their (lowered, compiled) delegate."""
    start = time.perf_counter()
    sub = extract_subgraph(gm, tag)
    prepared = prepared or prepare_delegate(gm, tag, spec)
    original, lowered, result = prepared.original, prepared.lowered, prepared.result
    name = f"lowered_module_{index}"
    payload = result.inline_bytes or result.processed_bytes  # every block in place: what the host checks and runs
    named = {tosa_key(payload): lowered.tosa} if spec.embed_tosa else {}
    module = LoweredBackendModule(spec.backend_id, payload, spec.to_list(), original, lowered.tosa,
                                  spec.tosa_spec, result.report, lowered.op_count, named,
                                  [v.order for v in lowered.inputs], [v.order for v in lowered.outputs])
    module.stored_bytes = result.processed_bytes
    for key, (data_tag, data) in result.external.items():
        module.external_data.setdefault(data_tag, {})[key] = NamedBlob(data)
    gm.add_module(name, module)
    members = [n for n in gm.graph.nodes if n.meta.get(TAG_KEY) == tag]
    with gm.graph.inserting_after(members[-1]):
        get = gm.graph.get_attr(name)
    with gm.graph.inserting_after(get):
        call = gm.graph.call_function(executorch_call_delegate, (get, *sub.inputs))
    call.meta["val"] = tuple(o.meta["val"].to(torch.int32) if v.dtype == DType.INT32 else o.meta["val"]
                             for o, v in zip(sub.outputs, lowered.outputs))
    anchor = call
    for i, (out, value) in enumerate(zip(sub.outputs, lowered.outputs)):
        with gm.graph.inserting_after(anchor):
            item = gm.graph.call_function(operator.getitem, (call, i))
        item.meta["val"] = out.meta["val"]
        anchor = item
        if out.meta["val"].dtype == torch.int64 and value.dtype == DType.INT32:  # indices: widen on the CPU
            item.meta["val"] = out.meta["val"].to(torch.int32)
            with gm.graph.inserting_after(item):
                anchor = gm.graph.call_function(torch.ops.aten._to_copy.default, (item,), {"dtype": torch.int64})
            anchor.meta["val"] = out.meta["val"]
        out.replace_all_uses_with(anchor, delete_user_cb=lambda user: user.meta.get(TAG_KEY) != tag)
    for n in reversed(members):
        gm.graph.erase_node(n)
    for c in sub.constants:
        if not c.users:
            gm.graph.erase_node(c)
    if spec.path_for_intermediates:
        folder = Path(spec.path_for_intermediates)
        folder.mkdir(parents=True, exist_ok=True)
        for kind, data in result.artifacts.items():
            write_atomic(folder / f"{name}.{kind}", data)
    return DelegateInfo(name, spec.backend_id, spec.target_name, len(members), dict(lowered.op_count),
                        len(result.processed_bytes), result.report, time.perf_counter() - start)
