"""``tosakit inspect FILE --explore``: a program in Google's Model Explorer, with where its time goes as node
overlays. Written as files Model Explorer reads: the program's instructions as a graph of its own JSON format
(CPU kernels and delegate calls, the values between them), each Ethos-U delegate that carries its TOSA as a
``.tosa`` file that Arm's TOSA adapter draws (its node ids are ``main/op<k>``, the operator's index in the main
block), one that does not as the NPU operations of its command stream; and per measure one node-data file
(placement, estimated time or cycles, each counter). ``serve`` starts Model Explorer's server on them."""

from __future__ import annotations

import bisect
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import TosakitError, write_atomic
from ..program import schema as S
from ..program.kernels import kernel_key, kernel_schemas
from ..runtime.ethosu.profile import NpuProfile, progress
from ..runtime.profile import ProgramProfile
from .operation_map import OperationMap

TOSA_ADAPTER = ("tosa_adapter_model_explorer", "tosa_flatbuffer_adapter")  # Arm's: (extension, adapter id)
PLACEMENT_COLOURS = {"CPU": "#f4b183", "NPU": "#a9d18e", "GPU": "#9dc3e6", "fused": "#e2e2e2"}
GRADIENT = [{"stop": 0, "bgColor": "#ffffff"}, {"stop": 1, "bgColor": "#e0301e"}]


@dataclass(frozen=True)
class Overlay:
    """One node-data run: its label, the model file it colours, and per graph id each node's value (and colour)."""

    name: str
    model: str
    graphs: dict[str, dict[str, dict]]
    numeric: bool = True

    def to_json(self) -> str:
        extra = {"gradient": GRADIENT} if self.numeric else {}
        return json.dumps({g: {"results": r, **extra} for g, r in self.graphs.items()})


@dataclass
class Exploration:
    """What ``write_exploration`` wrote into ``folder``: the models (path, adapter id) and overlays (path, model
    file name), in the order Model Explorer lists them."""

    folder: Path
    models: list[tuple[Path, str]] = field(default_factory=list)
    overlays: list[tuple[Path, str]] = field(default_factory=list)

    shown: tuple[str, str, str] | None = None  # (model file, graph id, node id) the page opens on

    def url(self, host: str, port: int) -> str:
        """The page that opens every model with every overlay, on ``shown`` (its layer ``main`` opened: a TOSA
        graph's operators all lie in it) when set."""
        data: dict = {"models": [{"url": str(p), **({"adapterId": a} if a else {})} for p, a in self.models],
                      "nodeData": [str(p) for p, _ in self.overlays],
                      "nodeDataTargets": [m for _, m in self.overlays]}
        if self.shown is not None:
            model, graph, node = self.shown
            data["uiState"] = {"paneStates": [{"deepestExpandedGroupNodeIds": ["main___group___"],
                                               "selectedCollectionLabel": model, "selectedGraphId": graph,
                                               "selectedNodeId": node, "widthFraction": 1}]}
        return f"http://{host}:{port}/?data={urllib.parse.quote(json.dumps(data))}"


def _placement(backend: str) -> str:
    return {"EthosUBackend": "NPU", "VgfBackend": "GPU"}.get(backend, "CPU")


def _result(value, colour: str | None = None) -> dict:
    return {"value": value, **({"bgColor": colour} if colour else {})}


def _tensor_attrs(plan: S.ExecutionPlan, v: int) -> list[dict]:
    t = plan.values[v].val
    attrs = [{"key": "tensor_name", "value": f"value {v}"}]
    if isinstance(t, S.Tensor):
        attrs += [{"key": "shape", "value": str(list(t.sizes))},
                  {"key": "dtype", "value": S.ScalarType(t.scalar_type).name}]
    return attrs


def _instruction_io(plan: S.ExecutionPlan, call, written: set[int]) -> tuple[list[int], list[int]]:
    """A call's tensor inputs and outputs: a kernel's by its schema (its written arguments and its return are
    outputs), a delegate's by order (the values no instruction wrote before it are its outputs)."""
    def tensors(v: int) -> list[int]:
        val = plan.values[v].val
        if isinstance(val, S.Tensor):
            return [v]
        if isinstance(val, (S.TensorList, S.OptionalTensorList)):
            return [i for i in val.items if i >= 0 and isinstance(plan.values[i].val, S.Tensor)]
        return []

    if isinstance(call, S.KernelCall):
        op = plan.operators[call.op_index]
        schema = kernel_schemas().get(kernel_key(op.name, op.overload))
        outs = {len(call.args) - 1} | ({k for k, a in enumerate(schema.args) if a.is_out} if schema else set())
        ins = [t for k, v in enumerate(call.args) if k not in outs for t in tensors(v)]
        return ins, list(dict.fromkeys(t for k in sorted(outs) if k < len(call.args) for t in tensors(call.args[k])))
    args = [t for v in call.args for t in tensors(v)]
    return [v for v in args if v in written], [v for v in args if v not in written]


def program_graph(plan: S.ExecutionPlan) -> tuple[dict, dict[int, str]]:
    """The method's calls as a Model Explorer graph (id = the method's name): Inputs, one node per kernel or
    delegate call (id ``i<instruction>``), Outputs, an edge per value; and each call node's placement."""
    instructions = plan.chains[0].instructions if plan.chains else []
    producer = {v: "inputs" for v in plan.inputs}
    written = set(plan.inputs) | {v for v, e in enumerate(plan.values)
                                  if isinstance(e.val, S.Tensor) and e.val.data_buffer_idx > 0}
    inputs_node = {"id": "inputs", "label": "Inputs", "namespace": "",
                   "outputsMetadata": [{"id": str(v), "attrs": _tensor_attrs(plan, v)} for v in plan.inputs]}
    nodes, placement = [inputs_node], {}
    for k, instruction in enumerate(instructions):
        call = instruction.instr_args
        if not isinstance(call, (S.KernelCall, S.DelegateCall)):
            continue
        ins, outs = _instruction_io(plan, call, written)
        if isinstance(call, S.KernelCall):
            op = plan.operators[call.op_index]
            label, where = kernel_key(op.name, op.overload), "CPU"
        else:
            backend = plan.delegates[call.delegate_index].id
            label, where = f"{backend} (delegate {call.delegate_index})", _placement(backend)
        node_id = f"i{k}"
        placement[k] = where
        nodes.append({"id": node_id, "label": label, "namespace": "",
                      "attrs": [{"key": "instruction", "value": str(k)}, {"key": "placement", "value": where}],
                      "incomingEdges": [{"sourceNodeId": producer[v], "sourceNodeOutputId": str(v),
                                         "targetNodeInputId": str(j)} for j, v in enumerate(ins) if v in producer],
                      "outputsMetadata": [{"id": str(v), "attrs": _tensor_attrs(plan, v)} for v in outs]})
        for v in outs:
            producer[v] = node_id
            written.add(v)
    nodes.append({"id": "outputs", "label": "Outputs", "namespace": "",
                  "incomingEdges": [{"sourceNodeId": producer[v], "sourceNodeOutputId": str(v),
                                     "targetNodeInputId": str(j)} for j, v in enumerate(plan.outputs)
                                    if v in producer]})
    return {"id": plan.name, "nodes": nodes}, placement


def stream_graph(graph_id: str, profile: NpuProfile) -> dict:
    """A delegate that carries no TOSA: its command stream's operations in order (id ``op<index>``)."""
    nodes, before = [], None
    for op in profile.operations:
        node = {"id": f"op{op.index}", "label": op.operation, "namespace": "",
                "attrs": [{"key": "offset", "value": f"{op.offset:#x}"}, {"key": "bound_by", "value": op.bound_by}]}
        if before is not None:
            node["incomingEdges"] = [{"sourceNodeId": before, "sourceNodeOutputId": "0", "targetNodeInputId": "0"}]
        nodes.append(node)
        before = node["id"]
    return {"id": graph_id, "nodes": nodes}


def tosa_measures(mapping: OperationMap, profile: NpuProfile) -> dict[int, dict[str, int]]:
    """Per TOSA operator index, its NPU operations' share: ``cycles`` the compute engine's progress over its
    operations (from the end of the operation before to its own end, so the shares add up to the stream's time
    but for DMA after the last one), its MACs and each counter. A command belongs to the first operation of the
    map placed at or after it (Vela places an operation at its last NPU operation command); the DMA that fetches
    an operation's weights counts for it."""
    starts = [op.offset for op in mapping.operations]
    out: dict[int, dict[str, int]] = {}

    def owner(offset: int) -> dict[str, int]:
        index = mapping.operations[min(len(starts) - 1, bisect.bisect_left(starts, offset))].tosa_index
        return out.setdefault(index, {"cycles": 0, "MACs": 0})

    for op, share in progress(profile.operations):
        owner(op.offset)["cycles"] += share
    for op in profile.operations:
        measure = owner(op.offset)
        measure["MACs"] += op.macs
        for name, value in op.counters.items():
            measure[name] = measure.get(name, 0) + value
    return out


def tosa_operators(tosa: bytes) -> list[str]:
    """The main block's operators, by name (CONST included: Arm's adapter numbers its nodes the same way)."""
    from tosa.Op import Op
    from tosa.TosaGraph import TosaGraph

    names = {v: k for k, v in vars(Op).items() if not k.startswith("_")}
    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    return [names.get(block.Operators(i).Op(), "?") for i in range(block.OperatorsLength())]


def _tosa_overlays(name: str, model: str, tosa: bytes, measures: dict[int, dict[str, int]]) -> list[Overlay]:
    """A delegate's TOSA overlays: placement (an operator no NPU operation of its own computes is fused into
    another, or moves nothing), then estimated cycles, MACs and each counter, keyed ``main/op<k>``."""
    placement = {}
    for k, op in enumerate(tosa_operators(tosa)):
        if op in ("CONST", "CONST_SHAPE"):
            continue
        where = "NPU" if k in measures else "fused"
        placement[f"main/op{k}"] = _result(where, PLACEMENT_COLOURS[where])
    overlays = [Overlay(f"{name} - placement", model, {"main": placement}, numeric=False)]
    keys = list(dict.fromkeys(key for m in measures.values() for key in m if key != "cycles")) + ["cycles"]
    for key in keys:  # estimated cycles last: Model Explorer colours the graph by the run added last
        values = {f"main/op{k}": _result(m.get(key, 0)) for k, m in sorted(measures.items())}
        if any(r["value"] for r in values.values()):
            label = "estimated cycles" if key == "cycles" else key
            overlays.append(Overlay(f"{name} - {label}", model, {"main": values}))
    return overlays


def _stream_overlays(name: str, model: str, graph_id: str, profile: NpuProfile) -> list[Overlay]:
    """A TOSA-less delegate's overlays on its stream graph: estimated cycles, MACs and each counter per operation."""
    columns: dict[str, dict[str, dict]] = {"MACs": {}}
    for op in profile.operations:
        columns["MACs"][f"op{op.index}"] = _result(op.macs)
        for key, value in op.counters.items():
            columns.setdefault(key, {})[f"op{op.index}"] = _result(value)
    columns["estimated cycles"] = {f"op{op.index}": _result(op.cycles) for op in profile.operations}
    return [Overlay(f"{name} - {key}", model, {graph_id: values}) for key, values in columns.items()
            if any(r["value"] for r in values.values())]


def write_exploration(folder: Path, stem: str, plan: S.ExecutionPlan, profile: ProgramProfile,
                      tosa: dict[int, tuple[bytes, OperationMap]]) -> Exploration:
    """Write the program's graph (``<stem>.json``), each delegate's TOSA (``<stem>.delegate<k>.tosa``, from
    ``tosa``: per delegate index its TOSA and the operation map of its stream) and the overlay files into
    ``folder``, each file whole or not at all."""
    folder.mkdir(parents=True, exist_ok=True)
    graph, placement = program_graph(plan)
    program_file = f"{stem}.json"
    graphs, overlays = [graph], []
    spans: dict[int, tuple[float, float]] = {}  # per instruction, its span of the timeline (its NPU and DMA overlap)
    for e in profile.events:
        start, end = spans.get(e.instruction, (e.start_us, e.start_us))
        spans[e.instruction] = (min(start, e.start_us), max(end, e.start_us + e.duration_us))
    time_us = {f"i{k}": _result(round(end - start, 3)) for k, (start, end) in spans.items()}
    overlays.append(Overlay(f"{plan.name} - placement", program_file, {plan.name: {
        f"i{k}": _result(where, PLACEMENT_COLOURS[where]) for k, where in placement.items()}}, numeric=False))
    overlays.append(Overlay(f"{plan.name} - estimated time (us)", program_file, {plan.name: time_us}))
    models: list[tuple[str, str]] = [(program_file, "")]
    shown = None
    for instruction, npu in profile.npu:
        index = plan.chains[0].instructions[instruction].instr_args.delegate_index
        name = f"delegate {index}"
        if index in tosa and tosa[index][1].operations:
            model = f"{stem}.delegate{index}.tosa"
            if (model, TOSA_ADAPTER[1]) not in models:
                write_atomic(folder / model, tosa[index][0])
                models.append((model, TOSA_ADAPTER[1]))
                measures = tosa_measures(tosa[index][1], npu)
                overlays += _tosa_overlays(name, model, tosa[index][0], measures)
                heaviest = max(measures, key=lambda k: measures[k]["cycles"])
                shown = shown or (model, "main", f"main/op{heaviest}")
        elif not any(g["id"] == f"{name} stream" for g in graphs):
            graphs.append(stream_graph(f"{name} stream", npu))
            overlays += _stream_overlays(name, program_file, f"{name} stream", npu)
    # the collection's label is the file's name: Model Explorer pairs overlays with models by it
    write_atomic(folder / program_file, json.dumps({"label": program_file, "graphs": graphs}).encode())
    out = Exploration(folder.resolve(), [((folder / m).resolve(), a) for m, a in models], shown=shown)
    for overlay in overlays:  # Model Explorer names an overlay run by its file
        path = folder / f"{overlay.name}.json"
        write_atomic(path, overlay.to_json().encode())
        out.overlays.append((path.resolve(), overlay.model))
    return out


def explorer_command(host: str, port: int) -> list[str]:
    """Model Explorer's server, with Arm's TOSA adapter, on ``host:port``, opening no browser."""
    return [sys.executable, "-c", "import sys; from model_explorer.cmdline import main; sys.exit(main())",
            "--no_open_in_browser", f"--host={host}", f"--port={port}", f"--extensions={TOSA_ADAPTER[0]}"]


def check_explorer() -> None:
    """Refuse before any work when Model Explorer or Arm's TOSA adapter is not installed."""
    import importlib.util

    missing = [m for m in ("model_explorer", TOSA_ADAPTER[0]) if importlib.util.find_spec(m) is None]
    if missing:
        raise TosakitError(f"--explore needs Google's Model Explorer and Arm's TOSA adapter ({', '.join(missing)} "
                           "is not installed)", "pip install 'tosakit[explore]' (make setup installs it)")


def free_port(host: str) -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def serve(host: str, port: int) -> subprocess.Popen:
    """Start Model Explorer's server; return once it answers (its process), or raise with what it printed."""
    process = subprocess.Popen(explorer_command(host, port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    said = []
    for line in process.stdout:
        said.append(line.rstrip())
        if line.startswith("Press Ctrl+C"):
            threading.Thread(target=process.stdout.read, daemon=True).start()  # its pipe never fills
            return process
    process.wait()
    raise TosakitError(f"Model Explorer's server did not start on {host}:{port}: " + " | ".join(said[-5:]),
                       "pick another --port, or check `python -m model_explorer --help` works")
