"""``--verify`` per layer: each delegate lowered again with every op's result as an output, each op's TOSA
result compared with the same value in two PyTorch graphs:

- the fake-quantized model (exact, fed the lowering's own integers): did the lowering compute this op
  right?
- the float model (``float_graph``): how much quantization has cost by this point. Nodes are paired by what
  they compute, not by name (``pairing``), so a value is only ever compared with the same value.

Integer layers also say how many of their values the calibrated range clips (``saturated``): a range
calibrated on data unlike the inputs verified clips them, and no rounding figure explains that loss."""

from __future__ import annotations

import copy
import operator

import torch
from torch.fx import GraphModule, Node

from ..capture import with_state
from ..lower import lower_partition
from ..program import EdgeProgramManager, LoweredBackendModule
from ..program.emit import executorch_call_delegate
from ..quantize.qdq import QParams, is_quantize, qparams_of
from ..runtime.delegates import ExactInterpreter
from ..runtime.stored import run_stored
from .float_graph import FloatReference, Recorder, quantized_const_key
from .npu_ops import NpuOpReport, compare_delegate
from .pairing import Keys, Numbering
from .report import Agreement, InputReport, LayerReport


class _DelegateArgs(Recorder):
    """Runs the edge graph in PyTorch, keeping every value and each delegate call's inputs."""

    def __init__(self, gm):
        super().__init__(gm)
        self.calls: dict[Node, tuple[str, LoweredBackendModule, tuple]] = {}

    def run_node(self, n):
        self._node = n
        return super().run_node(n)

    def call_function(self, target, args, kwargs):
        if target is executorch_call_delegate:
            name = next(n for n, m in self.module.named_children() if m is args[0])
            self.calls[self._node] = (name, args[0], tuple(args[1:]))
        return super().call_function(target, args, kwargs)


def layer_reports(edge: EdgeProgramManager, inputs: tuple, float_ref: FloatReference | None) -> list[LayerReport]:
    """Each delegate relowered with every op's result as an output, against PyTorch."""
    return delegate_reports(edge, inputs, float_ref, layers=True)[0]


def delegate_reports(edge: EdgeProgramManager, inputs: tuple, float_ref: FloatReference | None, layers: bool,
                     npu: bool = False) -> tuple[list[LayerReport], list[InputReport], list[NpuOpReport]]:
    """Layer rows (with ``layers``), the delegates' quantized inputs, and with ``npu`` each simulated Ethos-U
    delegate's NPU operations against its TOSA (on the inputs the delegate gets)."""
    gm = edge.program.graph_module
    runner = _DelegateArgs(gm)
    with torch.no_grad():
        runner.run(*with_state(gm.graph, inputs))
    keys = float_ref.keys if float_ref is not None else Keys()
    outer = Numbering(keys, lambda n: quantized_const_key(float_ref, n, runner.values, gm) if float_ref
                       else keys.unique())
    source: dict[Node, str] = {}  # node -> where values were clipped on its way (SATURATION_NOTABLE)
    rows: list[LayerReport] = []
    quantized_inputs: list[InputReport] = []
    npu_ops: list[NpuOpReport] = []
    index = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            outer.seed(node, keys.intern(("input", index)))
            index += 1
            continue
        if node in runner.calls:
            name, module, args = runner.calls[node]
            for a in node.args[1:]:
                if is_quantize(a) and isinstance(a.args[0], Node):
                    x, q = runner.values.get(a.args[0].name), qparams_of(a, gm)
                    if isinstance(x, torch.Tensor) and x.is_floating_point():
                        quantized_inputs.append(InputReport(name, a.args[0].name, tuple(x.shape),
                                                            clipped_share(x, q), (q.qmin, q.qmax)))
                        if quantized_inputs[-1].saturates:
                            source[a] = a.args[0].name
            seeds = [(outer.get(a) if isinstance(a, Node) else keys.unique(), _source_of(a, source))
                     for a in node.args[1:]]
            outs = _delegate_rows(name, module, args, seeds, float_ref, keys, rows) if layers else None
            if npu:
                npu_ops += compare_delegate(name, module, args)
            for user in node.users:
                if user.target is operator.getitem and outs is not None:
                    outer.seed(user, outs[user.args[1]][0])
                    if outs[user.args[1]][1]:
                        source[user] = outs[user.args[1]][1]
                elif user.target is operator.getitem:
                    outer.seed(user, keys.unique())
            outer.varying.add(node)
            outer.key[node] = keys.unique()
            continue
        if node in outer.key:
            continue
        outer.add(node)
        src = _source_of_inputs(node, source)
        if src:
            source[node] = src
    return rows, quantized_inputs, npu_ops


def _source_of(a, source: dict) -> str | None:
    return source.get(a) if isinstance(a, Node) else None


def _source_of_inputs(node: Node, source: dict) -> str | None:
    return next((source[i] for i in node.all_input_nodes if i in source), None)


def _delegate_rows(name: str, module: LoweredBackendModule, args: tuple, seeds: list, float_ref, keys: Keys,
                   rows: list) -> list[tuple[int, str | None]]:
    """Append the delegate's layer rows; returns each delegate output's key and saturation source."""
    original = module.original_module
    graph = copy.deepcopy(original)
    lowered = lower_partition(graph, module.tosa_spec, probes=True)
    results = run_stored(lowered.tosa, list(args), [v.order for v in lowered.inputs], [])[len(lowered.outputs):]
    got = dict(zip((node for node, _ in lowered.probes), results))
    nodes = {n.name: n for n in graph.graph.nodes}
    # Each layer's reference is computed from the TOSA results of the layers before it, so a
    # difference is that layer's own, not an earlier rounding flip amplified by the network.
    forced = {}
    for node_name, value in got.items():
        ref_node = _quantize_after(nodes[node_name], original)
        if ref_node is not None:
            forced[ref_node.name] = value
    exact: dict[str, object] = {}
    with torch.no_grad():
        ExactInterpreter(original, exact, forced).run(*args)
    numbering = Numbering(keys, lambda n: quantized_const_key(float_ref, n, exact, original) if float_ref
                           else keys.unique())
    orig = list(original.graph.nodes)
    placeholders = [n for n in orig if n.op == "placeholder"]
    source: dict[str, str] = {}  # original node name -> saturation source
    for p, (key, src) in zip(placeholders, seeds):
        numbering.seed(p, key)
        if src:
            source[p.name] = src
    for n in orig:
        numbering.add(n)
    start = len(rows)
    for node_name, value in lowered.probes:
        rows.append(_layer_row(name, nodes[node_name], value, got[node_name], original, exact, float_ref,
                               numbering))
    # where values were clipped on the way to each op: its own clipping, else the nearest before it
    own = {}
    for row in rows[start:]:
        if row.saturates:
            own[nodes[row.node].meta.get("tosakit_fused", row.node)] = row.node
    for n in orig:
        if n.name in own:
            source[n.name] = own[n.name]
        elif n.name not in source:
            src = next((source[i.name] for i in n.all_input_nodes if i.name in source), None)
            if src:
                source[n.name] = src
    for row in rows[start:]:
        row.saturation_source = source.get(nodes[row.node].meta.get("tosakit_fused", row.node))
    out = next(n for n in orig if n.op == "output")
    return [(numbering.key.get(a, keys.unique()) if isinstance(a, Node) else keys.unique(),
             source.get(a.name) if isinstance(a, Node) else None) for a in out.args[0]]


def _quantize_after(node, original: GraphModule):
    """The quantize node in the original graph that produces this (integer) op's result."""
    if node.meta.get("tosakit_q") is None:
        return None
    orig = {n.name: n for n in original.graph.nodes}.get(node.meta.get("tosakit_fused", node.name))
    if orig is None:
        return None
    return next((u for u in orig.users if is_quantize(u)), None)


def _reference_for(node, original: GraphModule, values: dict) -> tuple[object, QParams | None]:
    """The value the exact fake-quantized graph has where this op's result sits (after its quantize)."""
    quantize = _quantize_after(node, original)
    if quantize is not None:
        return values.get(quantize.name), node.meta["tosakit_q"]
    return values.get(node.meta.get("tosakit_fused", node.name)), None


def _layer_row(delegate: str, node, value, got: torch.Tensor, original: GraphModule, values: dict,
               float_ref: FloatReference | None, numbering: Numbering | None = None) -> LayerReport:
    ref, q = _reference_for(node, original, values)
    steps = rel = saturated = limits = None
    if isinstance(ref, torch.Tensor) and ref.shape == got.shape and got.numel():
        if q is not None:  # integers against the quantize after the op
            steps = float((got.long() - ref.long()).abs().max())
            quantize = _quantize_after(node, original)
            before = values.get(quantize.args[0].name) if isinstance(quantize.args[0], Node) else None
            if isinstance(before, torch.Tensor) and before.shape == got.shape:
                saturated, limits = clipped_share(before.double(), q), (q.qmin, q.qmax)
        elif value.q is not None and ref.is_floating_point():  # data movement of integers: its real values
            q = value.q
            steps = float((q.dequantize(got, torch.float64) - ref.double()).abs().max()) / q.s
        else:
            scale = float(ref.double().abs().max()) or 1.0
            rel = float((got.double() - ref.double()).abs().max()) / scale
    real = q.dequantize(got) if q is not None else (got.float() if got.is_floating_point() else None)
    float_value = None
    if float_ref is not None and numbering is not None:
        orig = {n.name: n for n in original.graph.nodes}.get(node.meta.get("tosakit_fused", node.name))
        key = numbering.key.get(orig) if orig is not None and orig in numbering.varying else None
        name = float_ref.name_of(key) if key is not None else None
        float_value = float_ref.values.get(name) if name is not None else None
    vs_float = (Agreement.of(real, float_value) if real is not None and isinstance(float_value, torch.Tensor)
                and float_value.shape == real.shape else None)
    return LayerReport(delegate, node.name, str(node.target), tuple(got.shape), q is not None, steps, rel, vs_float,
                       saturated, limits)


def clipped_share(x: torch.Tensor, q: QParams) -> float:
    """The share of ``x``'s values that quantizing with ``q`` clips to ``q.qmin`` or ``q.qmax`` (rounded as
    ``QParams.quantize`` rounds, in ``x``'s precision)."""
    if not x.numel():
        return 0.0
    v = q.steps(x, x.dtype)
    return float(((v < q.qmin) | (v > q.qmax)).double().mean())
