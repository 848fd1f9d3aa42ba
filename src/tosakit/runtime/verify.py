"""``--verify``: the lowered program against float PyTorch and the fake-quantized model, per output
and per layer, so a person sees at once where accuracy is lost."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.fx import GraphModule, Interpreter

from ..capture import capture, export
from ..lower import lower_partition, prepare_program
from ..program import EdgeProgramManager, ExecutorchProgramManager, LoweredBackendModule, tosa_key
from ..program.emit import executorch_call_delegate
from ..quantize.qdq import QParams, is_quantize
from .program import LoadedProgram
from .reference import ExactInterpreter, evaluate_exact, run_stored


@dataclass
class Agreement:
    """How close ``got`` is to a reference: max |error|, SNR, cosine similarity, top-1."""

    max_abs_error: float
    snr_db: float
    cosine: float
    top1: bool | None  # for classifier outputs [N, classes]

    @classmethod
    def of(cls, got: torch.Tensor, ref: torch.Tensor) -> "Agreement":
        g = got.detach().double().flatten()
        r = ref.detach().double().flatten()
        noise = float(((g - r) ** 2).sum())
        signal = float((r ** 2).sum())
        snr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal > 0 else -math.inf)
        denom = float(g.norm() * r.norm())
        cosine = float(g @ r) / denom if denom > 0 else float(noise == 0)
        top1 = None
        if ref.dim() == 2 and ref.shape[-1] > 1 and ref.is_floating_point():
            top1 = bool((got.argmax(-1) == ref.argmax(-1)).all())
        return cls(float((g - r).abs().max()) if g.numel() else 0.0, snr, cosine, top1)


@dataclass
class OutputReport:
    index: int
    shape: tuple[int, ...]
    vs_float: Agreement | None
    vs_fake_quant: Agreement | None


@dataclass
class LayerReport:
    """One op inside a delegate: its TOSA result against the same PyTorch node."""

    delegate: str
    node: str
    target: str
    shape: tuple[int, ...]
    integer: bool
    steps_off: float | None  # integer ops: max difference from the fake-quantized model, in steps
    rel_error: float | None  # float ops: max relative difference from the (exact) reference
    vs_float: Agreement | None  # against the float model's node, when it has one

    @property
    def matches(self) -> bool:
        return (self.steps_off is not None and self.steps_off <= 1) or (
            self.rel_error is not None and self.rel_error <= 1e-4)


@dataclass
class VerifyReport:
    outputs: list[OutputReport]
    layers: list[LayerReport] = field(default_factory=list)

    @property
    def first_divergent_layer(self) -> LayerReport | None:
        return next((layer for layer in self.layers if not layer.matches), None)

    def table(self) -> str:
        """The per-output table for the terminal."""
        lines = [f"{'output':<18}{'reference':<14}{'max |err|':>12}{'SNR dB':>9}{'cosine':>10}{'top-1':>7}"]
        for o in self.outputs:
            for name, a in (("float", o.vs_float), ("fake-quant", o.vs_fake_quant)):
                if a is None:
                    continue
                top = "-" if a.top1 is None else ("yes" if a.top1 else "NO")
                lines.append(f"{f'{o.index} {list(o.shape)}':<18}{name:<14}{a.max_abs_error:>12.4g}"
                             f"{_db(a.snr_db):>9}{a.cosine:>10.5f}{top:>7}")
        if self.layers:
            bad = self.first_divergent_layer
            worst = min((layer for layer in self.layers if layer.vs_float), key=lambda l: l.vs_float.snr_db,
                        default=None)
            lines.append(f"layers checked: {len(self.layers)}; "
                         + (f"first divergent from the fake-quantized model: {bad.node} ({bad.target})" if bad
                            else "every layer matches the fake-quantized model"))
            if worst is not None:
                lines.append(f"lowest SNR against float: {worst.node} ({worst.target}) {_db(worst.vs_float.snr_db)} dB")
        return "\n".join(lines)


def _db(x: float) -> str:
    return "inf" if math.isinf(x) and x > 0 else f"{x:.1f}"


class _Recorder(Interpreter):
    """Runs a graph and keeps every node's result by name."""

    def __init__(self, gm: GraphModule):
        super().__init__(gm)
        self.values: dict[str, object] = {}

    def run_node(self, n):
        out = super().run_node(n)
        self.values[n.name] = out
        return out


def float_node_values(model: torch.nn.Module, inputs: tuple) -> dict[str, object]:
    """Every node's value in the float model's captured graph, by node name."""
    program = capture(export(model, inputs))
    gm = prepare_program(program.graph_module)
    recorder = _Recorder(gm)
    with torch.no_grad():
        recorder.run(*inputs)
    return recorder.values


class _DelegateArgs(Interpreter):
    """Runs the edge graph in PyTorch, keeping each delegate's input tensors."""

    def __init__(self, gm):
        super().__init__(gm)
        self.calls: list[tuple[str, LoweredBackendModule, tuple]] = []

    def call_function(self, target, args, kwargs):
        if target is executorch_call_delegate:
            name = next(n for n, m in self.module.named_children() if m is args[0])
            self.calls.append((name, args[0], tuple(args[1:])))
        return super().call_function(target, args, kwargs)


def layer_reports(edge: EdgeProgramManager, inputs: tuple, float_values: dict | None) -> list[LayerReport]:
    """Each delegate relowered with every op's result as an output, against PyTorch."""
    runner = _DelegateArgs(edge.program.graph_module)
    with torch.no_grad():
        runner.run(*inputs)
    rows = []
    for name, module, args in runner.calls:
        graph = copy.deepcopy(module.original_module)
        lowered = lower_partition(graph, module.tosa_spec, probes=True)
        results = run_stored(lowered.tosa, list(args), [v.order for v in lowered.inputs], [])[len(lowered.outputs):]
        got = dict(zip((node for node, _ in lowered.probes), results))
        nodes = {n.name: n for n in graph.graph.nodes}
        # Each layer's reference is computed from the TOSA results of the layers before it, so a
        # difference is that layer's own, not an earlier rounding flip amplified by the network.
        forced = {}
        for node_name, value in got.items():
            ref_node = _quantize_after(nodes[node_name], module.original_module)
            if ref_node is not None:
                forced[ref_node.name] = value
        exact: dict[str, object] = {}
        with torch.no_grad():
            ExactInterpreter(module.original_module, exact, forced).run(*args)
        for node_name, value in lowered.probes:
            rows.append(_layer_row(name, nodes[node_name], value, got[node_name], module.original_module, exact,
                                   float_values))
    return rows


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
               float_values: dict | None) -> LayerReport:
    ref, q = _reference_for(node, original, values)
    steps = rel = None
    if isinstance(ref, torch.Tensor) and ref.shape == got.shape and got.numel():
        if q is not None:  # integers against the quantize after the op
            steps = float((got.long() - ref.long()).abs().max())
        elif value.q is not None and ref.is_floating_point():  # data movement of integers: its real values
            q = value.q
            steps = float((q.dequantize(got, torch.float64) - ref.double()).abs().max()) / q.s
        else:
            scale = float(ref.double().abs().max()) or 1.0
            rel = float((got.double() - ref.double()).abs().max()) / scale
    real = q.dequantize(got) if q is not None else (got.float() if got.is_floating_point() else None)
    float_ref = (float_values or {}).get(node.meta.get("tosakit_fused", node.name))
    vs_float = (Agreement.of(real, float_ref) if real is not None and isinstance(float_ref, torch.Tensor)
                and float_ref.shape == real.shape else None)
    return LayerReport(delegate, node.name, str(node.target), tuple(got.shape), q is not None, steps, rel, vs_float)


def verify(edge: EdgeProgramManager, program: ExecutorchProgramManager, inputs: tuple,
           float_model: torch.nn.Module | None = None, fake_quant: GraphModule | None = None,
           layers: bool = False) -> VerifyReport:
    """Run the emitted program on the host and compare it with float PyTorch and the fake-quantized
    model (``convert_pt2e`` output, evaluated exactly: see ``ExactInterpreter``)."""
    tosa = {tosa_key(m.processed_bytes): m.tosa for m in edge.program.graph_module.children()
            if isinstance(m, LoweredBackendModule)}
    got = LoadedProgram(program.buffer, "the lowered program", tosa, isolate=False).run(list(inputs))
    with torch.no_grad():
        floats = _as_tuple(float_model(*inputs)) if float_model is not None else None
    fakes = evaluate_exact(fake_quant, *inputs) if fake_quant is not None else None
    outputs = []
    for i, g in enumerate(got):
        outputs.append(OutputReport(
            i, tuple(g.shape),
            Agreement.of(g, floats[i]) if floats is not None and g.is_floating_point() else None,
            Agreement.of(g, fakes[i]) if fakes is not None and g.is_floating_point() else None,
        ))
    float_values = float_node_values(float_model, inputs) if (layers and float_model is not None) else None
    return VerifyReport(outputs, layer_reports(edge, inputs, float_values) if layers else [])


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)
