"""``--verify``: the lowered program against float PyTorch and the fake-quantized model, per output
and per layer, so a person sees at once where accuracy is lost.

Per layer, each op's TOSA result is compared with the same value in two PyTorch graphs:

- the fake-quantized model (exact, fed the lowering's own integers): did the lowering compute this op
  right?
- the float model: how much quantization has cost by this point. The float graph compared against is the
  quantizer's own float graph (``prepare_pt2e`` with its observers taken out), since the quantizer rewrites
  some layers before it quantizes them (softmax, norms and attention become their steps; attention scales
  the scores, not q and k); nodes are paired by what they compute, not by name (``_Keys``), so a value
  is only ever compared with the same value.

Integer layers also say how many of their values the calibrated range clips (``saturated``): a range
calibrated on data unlike the inputs verified clips them, and no rounding figure explains that loss."""

from __future__ import annotations

import copy
import math
import operator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.fx import GraphModule, Interpreter, Node

from ..capture import capture, export, with_state
from ..errors import TosakitError
from ..lower import lower_partition, prepare_program
from ..program import EdgeProgramManager, ExecutorchProgramManager, LoweredBackendModule, tosa_key
from ..program.emit import executorch_call_delegate
from ..quantize.qdq import QParams, is_dequantize, is_quantize, qparams_of
from .npu_ops import NpuOpReport, compare_delegate
from .npu_ops import summary as npu_summary
from .program import EngineComparison, LoadedProgram
from .reference import ExactInterpreter, evaluate_exact, run_stored

aten = torch.ops.aten

# A layer (or delegate input) that clips more than this share of its values to its integer limits is named,
# with the calibration data as the fix.
SATURATION_NOTABLE = 0.01


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
    vs_float: Agreement | None  # against the same value in the float model, when it has one
    # integer ops with their own output quantization: the share of values the calibrated range clips to
    # its limits (``limits``, qmin and qmax); None for data movement and float ops
    saturated: float | None = None
    limits: tuple[int, int] | None = None
    # the nearest op or quantized delegate input on the way to this layer (itself included) that clips more
    # than SATURATION_NOTABLE of its values: its loss is in this layer's figures against float
    saturation_source: str | None = None

    @property
    def matches(self) -> bool:
        return (self.steps_off is not None and self.steps_off <= 1) or (
            self.rel_error is not None and self.rel_error <= 1e-4)

    @property
    def saturates(self) -> bool:
        return self.saturated is not None and self.saturated > SATURATION_NOTABLE


@dataclass
class InputReport:
    """A delegate input quantized on the CPU: the share of its values the calibrated range clips."""

    delegate: str
    node: str  # the value quantized (a model input, or the CPU op before the delegate)
    shape: tuple[int, ...]
    saturated: float
    limits: tuple[int, int]

    @property
    def saturates(self) -> bool:
        return self.saturated > SATURATION_NOTABLE


@dataclass
class VerifyReport:
    outputs: list[OutputReport]
    layers: list[LayerReport] = field(default_factory=list)
    quantized_inputs: list[InputReport] = field(default_factory=list)
    # each Ethos-U delegate output the program computed on the NPU simulator, against its TOSA; or why the
    # simulator stopped (the program then ran its delegates' TOSA)
    engines: list[EngineComparison] = field(default_factory=list)
    npu_error: str | None = None
    # each NPU operation of the simulated Ethos-U delegates against the TOSA tensor it computes
    npu_ops: list[NpuOpReport] = field(default_factory=list)

    @property
    def first_divergent_layer(self) -> LayerReport | None:
        return next((layer for layer in self.layers if not layer.matches), None)

    @property
    def saturated(self) -> list[InputReport | LayerReport]:
        """Delegate inputs, then layers, that clip more than SATURATION_NOTABLE of their values."""
        return [i for i in self.quantized_inputs if i.saturates] + [layer for layer in self.layers if layer.saturates]

    def saturation_hint(self) -> str | None:
        """One line naming what saturates, with the fix; None when nothing does."""
        named = self.saturated
        if not named:
            return None
        parts = [f"{'input ' if isinstance(s, InputReport) else ''}{s.node} ({share_text(s.saturated)})" for s in named[:4]]
        if len(named) > 4:
            parts.append(f"{len(named) - 4} more")
        listed = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
        kinds = {limits_name(s.limits) for s in named}
        limits = f"the {kinds.pop()} limits" if len(kinds) == 1 else "their integer limits"
        return (f"{listed} clip{'s' if len(named) == 1 else ''} values at {limits}: the calibration data does "
                "not cover the inputs verified; "
                "calibrate on representative samples (--calibration PATH)")

    def saturation_note(self, layer: LayerReport) -> str:
        """Why this layer's figures against float may be poor, when values were clipped on its way."""
        if layer.saturation_source is None:
            return ""
        if layer.saturation_source == layer.node and layer.saturates:
            return f"saturated: {share_text(layer.saturated)} of its values at the {limits_name(layer.limits)} limits"
        inputs = {i.node for i in self.quantized_inputs}
        where = f"input {layer.saturation_source}" if layer.saturation_source in inputs else layer.saturation_source
        return f"after saturation at {where}"

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
        if self.npu_error:
            lines.append(f"Ethos-U command streams on the NPU simulator: stopped ({self.npu_error}); the figures "
                         f"above are the delegates' TOSA on the reference model")
        if self.engines:
            exact = sum(c.bit_exact for c in self.engines)
            lines.append(f"Ethos-U command streams run on the NPU simulator: {exact} of {len(self.engines)} delegate "
                         f"output(s) bit-exact with their TOSA on the reference model")
            lines += [f"  npu vs tosa: {c}" for c in self.engines if not c.bit_exact]
        if self.npu_ops:
            lines += npu_summary(self.npu_ops)
        if self.layers:
            bad = self.first_divergent_layer
            worst = min((layer for layer in self.layers if layer.vs_float), key=lambda l: l.vs_float.snr_db,
                        default=None)
            lines.append(f"layers checked: {len(self.layers)}; "
                         + (f"first divergent from the fake-quantized model: {bad.node} ({bad.target})" if bad
                            else "every layer matches the fake-quantized model"))
            if worst is not None:
                note = self.saturation_note(worst)
                lines.append(f"lowest SNR against float: {worst.node} ({worst.target}) {_db(worst.vs_float.snr_db)} dB"
                             + (f" ({note})" if note else ""))
        for s in self.saturated[:8]:
            snr = (f", SNR against float {_db(s.vs_float.snr_db)} dB"
                   if isinstance(s, LayerReport) and s.vs_float is not None else "")
            lines.append(f"saturated: {_what(s)}: {share_text(s.saturated)} of its values at the "
                         f"{limits_name(s.limits)} limits{snr}")
        if len(self.saturated) > 8:
            lines.append(f"saturated: {len(self.saturated) - 8} more (see the per-layer report)")
        hint = self.saturation_hint()
        if hint:
            lines.append("hint: " + hint)
        return "\n".join(lines)


def _what(s: InputReport | LayerReport) -> str:
    return f"input {s.node}" if isinstance(s, InputReport) else f"{s.node} ({s.target})"


def share_text(share: float) -> str:
    """A share of values as a percentage: 0.0042 -> 0.42%, 0.31 -> 31%."""
    return f"{100 * share:.2g}%" if share < 0.1 else f"{100 * share:.0f}%"


def limits_name(limits: tuple[int, int] | None) -> str:
    """(-128, 127) -> int8; other ranges as [qmin, qmax]."""
    if limits is None:
        return "integer"
    for bits in (8, 16, 32):
        if tuple(limits) == (-(1 << (bits - 1)), (1 << (bits - 1)) - 1):
            return f"int{bits}"
    return f"[{limits[0]}, {limits[1]}]"


def _db(x: float) -> str:
    return "inf" if math.isinf(x) and x > 0 else f"{x:.1f}"


def clipped_share(x: torch.Tensor, q: QParams) -> float:
    """The share of ``x``'s values that quantizing with ``q`` clips to ``q.qmin`` or ``q.qmax`` (rounded as
    ``QParams.quantize`` rounds, in ``x``'s precision)."""
    if not x.numel():
        return 0.0
    v = q.steps(x, x.dtype)
    return float(((v < q.qmin) | (v > q.qmax)).double().mean())


# ------------------------------------------------------------------ pairing nodes across graphs

SAME_VALUE = {aten.clone.default, aten.alias.default, aten.detach.default, aten.contiguous.default,
              aten.lift_fresh_copy.default}
RESHAPES = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.dim,
            aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.flatten.using_ints,
            aten.unflatten.int}


def _shape(node) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


class _Keys:
    """Value numbering shared by several graphs: two nodes get the same key when they compute the same
    function of the model's inputs. Quantize, dequantize and copies are looked through, chains of reshapes
    and of permutes are composed (two graphs often split them differently), and constants are keys by
    value: a quantized one is the float one it is within half a quantization step of."""

    def __init__(self):
        self.ids: dict[object, int] = {}

    def intern(self, key) -> int:
        return self.ids.setdefault(key, len(self.ids))

    def unique(self) -> int:
        return self.intern(object())


class _Numbering:
    """Keys of one graph's nodes, in graph order; ``const_key(node)`` gives a constant node's key."""

    def __init__(self, keys: _Keys, const_key):
        self.keys, self.const_key = keys, const_key
        self.key: dict[Node, int] = {}
        self.varying: set[Node] = set()  # nodes that depend on an input
        self._reshape: dict[Node, tuple[int, tuple]] = {}  # node -> (key, shape) of what it reshapes
        self._permute: dict[Node, tuple[int, tuple]] = {}  # node -> (key, dims) of what it permutes

    def seed(self, node: Node, key: int) -> None:
        self.key[node] = key
        self.varying.add(node)

    def get(self, node: Node) -> int:
        if node not in self.key:  # a constant, keyed when first used
            self.key[node] = self.const_key(node)
        return self.key[node]

    def add(self, node: Node) -> None:
        """Key ``node`` (its inputs are keyed already, graph order)."""
        if node in self.key or node.op in ("output", "get_attr"):
            return
        if node.op == "placeholder":
            self.seed(node, self.keys.unique())
            return
        if not any(i in self.varying for i in node.all_input_nodes):
            return  # a constant
        self.varying.add(node)
        self.key[node] = self._key(node)

    def _key(self, node: Node) -> int:
        t, a0 = node.target, node.args[0] if node.args else None
        if (is_quantize(node) or is_dequantize(node) or t in SAME_VALUE) and isinstance(a0, Node):
            for chain in (self._reshape, self._permute):  # the same value: the same chain
                if a0 in chain:
                    chain[node] = chain[a0]
            return self.get(a0)
        if t in RESHAPES and isinstance(a0, Node) and _shape(node) is not None:
            base, shape = self._reshape.get(a0, (self.get(a0), _shape(a0)))
            self._reshape[node] = (base, shape)
            return base if shape == _shape(node) else self.keys.intern(("reshape", base, _shape(node)))
        if t == aten.permute.default and isinstance(a0, Node):
            rank = len(node.args[1])
            dims = tuple(int(d) % rank for d in node.args[1])
            base, before = self._permute.get(a0, (self.get(a0), tuple(range(rank))))
            dims = tuple(before[d] for d in dims)
            self._permute[node] = (base, dims)
            return base if dims == tuple(range(rank)) else self.keys.intern(("permute", base, dims))
        return self.keys.intern((str(t), self._norm(node.args), self._norm(dict(sorted(node.kwargs.items())))))

    def _norm(self, a):
        if isinstance(a, Node):
            return ("node", self.get(a))
        if isinstance(a, (list, tuple)):
            return tuple(self._norm(x) for x in a)
        if isinstance(a, dict):
            return tuple((k, self._norm(v)) for k, v in a.items())
        try:
            hash(a)
            return a
        except TypeError:
            return repr(a)


@dataclass
class FloatReference:
    """Every value of the float model's graph, and which graph node each key names."""

    values: dict[str, object]
    keys: _Keys
    by_key: dict[int, str]
    constants: dict[tuple, list[tuple[torch.Tensor, int]]]  # (shape, dtype) -> [(value, key)]

    def constant_key(self, value, tolerance: torch.Tensor | float | None) -> int:
        """The key of the float constant ``value`` stands for: equal (``tolerance`` None) or within
        ``tolerance`` of it everywhere; a new key when there is none."""
        if not isinstance(value, torch.Tensor):
            return self.keys.unique()
        integer = not value.is_floating_point()
        v = value.detach()
        for c, key in self.constants.get(tuple(v.shape), []):
            if c.is_floating_point() == integer:
                continue
            if integer:
                if torch.equal(c.long(), v.long()):
                    return key
                continue
            head = min(16, v.numel())  # cheap rejection on a few values first
            tol = tolerance if tolerance is not None else 0.0
            diff = (c.double() - v.double()).abs()
            tol_t = torch.as_tensor(tol, dtype=torch.float64).expand_as(diff) if diff.dim() else \
                torch.as_tensor(tol, dtype=torch.float64)
            if head and not bool((diff.flatten()[:head] <= tol_t.flatten()[:head]).all()):
                continue
            if bool((diff <= tol_t).all()):
                return key
        return self.keys.unique()

    def name_of(self, key: int) -> str | None:
        return self.by_key.get(key)


def _float_twin(model: torch.nn.Module, inputs: tuple) -> GraphModule | None:
    """The float graph the quantizer quantized: ``export`` then ``prepare_pt2e`` (batch norms fused, layers
    rewritten for annotation) with its observers taken out; None when that fails."""
    try:
        from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e

        from ..quantize import TOSAQuantizer, get_symmetric_quantization_config

        gm = export(model, inputs).module()
        quantizer = TOSAQuantizer("TOSA-1.0+INT").set_global(get_symmetric_quantization_config())
        prepared = prepare_pt2e(gm, quantizer)
    except Exception:  # any failure leaves the plain float graph, which pairing still keeps honest
        return None
    for node in list(prepared.graph.nodes):
        if node.op == "call_module" and "activation_post_process" in str(node.target):
            node.replace_all_uses_with(node.args[0])
            prepared.graph.erase_node(node)
    prepared.graph.lint()
    prepared.recompile()
    return prepared


def float_reference(model: torch.nn.Module, inputs: tuple, quantized: bool = False) -> FloatReference:
    """Every node's value in the float model's captured graph (``quantized``: the graph the quantizer saw,
    ``_float_twin``), keyed for pairing (``_Keys``)."""
    twin = _float_twin(model, inputs) if quantized else None
    program = capture(export(twin if twin is not None else model, inputs))
    gm = prepare_program(program.graph_module)
    recorder = _Recorder(gm)
    with torch.no_grad():
        recorder.run(*with_state(gm.graph, inputs))
    keys = _Keys()
    ref = FloatReference(recorder.values, keys, {}, {})
    groups = ref.constants

    def const_key(node: Node) -> int:
        value = recorder.values.get(node.name)
        if not isinstance(value, torch.Tensor):
            return keys.unique()
        group = groups.setdefault(tuple(value.shape), [])
        for c, key in group:  # equal constants share a key: a quantized one may stand for either
            if c.dtype == value.dtype and torch.equal(c, value):
                return key
        key = keys.unique()
        group.append((value, key))
        return key

    numbering = _Numbering(keys, const_key)
    index = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            numbering.seed(node, keys.intern(("input", index)))
            index += 1
        numbering.add(node)
        if node in numbering.varying:
            ref.by_key.setdefault(numbering.key[node], node.name)
    return ref


def float_node_values(model: torch.nn.Module, inputs: tuple) -> dict[str, object]:
    """Every node's value in the float model's captured graph, by node name."""
    return float_reference(model, inputs).values


def _quantized_const_key(ref: FloatReference, node: Node, values: dict, gm: GraphModule) -> int:
    """A constant of the quantized graph: the float constant it was quantized from (half a step each way)."""
    value = values.get(node.name)
    if not isinstance(value, torch.Tensor):
        return ref.keys.unique()
    tolerance = None
    if is_dequantize(node):
        q = qparams_of(node, gm)
        scale = torch.as_tensor(q.scale, dtype=torch.float64)
        if q.per_channel:
            shape = [1] * value.dim()
            shape[q.axis] = -1
            scale = scale.reshape(shape)
        tolerance = scale * 0.501 + 1e-12  # rounded in float32: a hair over half a step
    elif value.is_floating_point():
        tolerance = 1e-6 * (float(value.detach().double().abs().max()) if value.numel() else 0.0) + 1e-12
    return ref.constant_key(value, tolerance)


# ------------------------------------------------------------------ running the graphs


class _Recorder(Interpreter):
    """Runs a graph and keeps every node's result by name."""

    def __init__(self, gm: GraphModule):
        super().__init__(gm)
        self.values: dict[str, object] = {}

    def run_node(self, n):
        out = super().run_node(n)
        self.values[n.name] = out
        return out


class _DelegateArgs(_Recorder):
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
    return _reports(edge, inputs, float_ref, layers=True)[0]


def input_reports(edge: EdgeProgramManager, inputs: tuple) -> list[InputReport]:
    """How much of each delegate input quantized on the CPU its calibrated range clips."""
    return _reports(edge, inputs, None, layers=False)[1]


def _reports(edge: EdgeProgramManager, inputs: tuple, float_ref: FloatReference | None, layers: bool,
             npu: bool = False) -> tuple[list[LayerReport], list[InputReport], list[NpuOpReport]]:
    """Layer rows (with ``layers``), the delegates' quantized inputs, and with ``npu`` each Ethos-U55/U65
    delegate's NPU operations against its TOSA (on the inputs the delegate gets)."""
    gm = edge.program.graph_module
    runner = _DelegateArgs(gm)
    with torch.no_grad():
        runner.run(*with_state(gm.graph, inputs))
    keys = float_ref.keys if float_ref is not None else _Keys()
    outer = _Numbering(keys, lambda n: _quantized_const_key(float_ref, n, runner.values, gm) if float_ref
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


def _delegate_rows(name: str, module: LoweredBackendModule, args: tuple, seeds: list, float_ref, keys: _Keys,
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
    numbering = _Numbering(keys, lambda n: _quantized_const_key(float_ref, n, exact, original) if float_ref
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
               float_ref: FloatReference | None, numbering: _Numbering | None = None) -> LayerReport:
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


def verify(edge: EdgeProgramManager, program: ExecutorchProgramManager, inputs: tuple,
           float_model: torch.nn.Module | None = None, fake_quant: GraphModule | None = None,
           layers: bool = False) -> VerifyReport:
    """Run the emitted program on the host (Ethos-U55/U65 delegates on the NPU simulator, each also on its TOSA
    to compare) and compare it with float PyTorch and the fake-quantized model (``convert_pt2e`` output,
    evaluated exactly: see ``ExactInterpreter``)."""
    tosa = {tosa_key(m.processed_bytes): m.tosa for m in edge.program.graph_module.children()
            if isinstance(m, LoweredBackendModule)}
    loaded = LoadedProgram(program.buffer, "the lowered program", tosa, isolate=False)
    engines, npu_error = [], None
    if loaded.layouts["forward"].delegate_npu:  # each one carries its TOSA here
        try:
            got, engines = loaded.run_and_compare(list(inputs))
        except TosakitError as exc:  # a finding to show, not a reason to refuse the program: verify its TOSA
            npu_error = exc.message
            got = LoadedProgram(program.buffer, "the lowered program", tosa, isolate=False, engine="tosa").run(
                list(inputs))
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
    rows, quantized_inputs, npu_ops = _reports(edge, inputs, float_ref, layers, npu=bool(engines) or bool(npu_error))
    return VerifyReport(outputs, rows, quantized_inputs, engines, npu_error, npu_ops)


def _same_kind(got: torch.Tensor, ref) -> bool:
    """Comparable outputs: both float, or both integer (an --int8-io program's integers are not the float
    model's values)."""
    return isinstance(ref, torch.Tensor) and got.is_floating_point() == ref.is_floating_point()


def _as_tuple(x) -> tuple:
    return tuple(x) if isinstance(x, (tuple, list)) else (x,)
