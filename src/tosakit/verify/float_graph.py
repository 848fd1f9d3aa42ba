"""The float model's graph, run with every node's value kept and keyed for pairing (``pairing.Keys``): the
quantizer's own float graph when the model is quantized (``prepare_pt2e`` with its observers taken out), since
the quantizer rewrites some layers before it quantizes them (softmax, norms and attention become their steps;
attention scales the scores, not q and k)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx import GraphModule, Interpreter, Node

from ..capture import capture, export, with_state
from ..lower import prepare_program
from ..quantize.qdq import is_dequantize, qparams_of
from .pairing import Keys, Numbering

@dataclass
class FloatReference:
    """Every value of the float model's graph, and which graph node each key names."""

    values: dict[str, object]
    keys: Keys
    by_key: dict[int, str]
    constants: dict[tuple, list[tuple[torch.Tensor, int]]]  # (shape, dtype) -> [(value, key)]

    def constant_key(self, value, tolerance: torch.Tensor | float | None) -> int:
        """The key of the float constant ``value`` stands for: equal (``tolerance`` None) or within
        ``tolerance`` of it everywhere; a new key when there is none. When several are (a quantized zero is within
        half a step of zero and of a norm's epsilon), the first, with the others kept as its alternatives
        (``Keys.alternatives``: the op reading it picks the one the float graph has)."""
        if not isinstance(value, torch.Tensor):
            return self.keys.unique()
        integer = not value.is_floating_point()
        v = value.detach()
        found = []
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
                found.append(key)
        if len(found) > 1:
            self.keys.alternatives[found[0]] = tuple(found[1:])
        return found[0] if found else self.keys.unique()

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
    ``_float_twin``), keyed for pairing (``Keys``)."""
    twin = _float_twin(model, inputs) if quantized else None
    program = capture(export(twin if twin is not None else model, inputs))
    gm = prepare_program(program.graph_module)
    recorder = Recorder(gm)
    with torch.no_grad():
        recorder.run(*with_state(gm.graph, inputs))
    keys = Keys()
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

    numbering = Numbering(keys, const_key)
    index = 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            numbering.seed(node, keys.intern(("input", index)))
            index += 1
        numbering.add(node)
        if node in numbering.varying:
            ref.by_key.setdefault(numbering.key[node], node.name)
    return ref


def quantized_const_key(ref: FloatReference, node: Node, values: dict, gm: GraphModule) -> int:
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


class Recorder(Interpreter):
    """Runs a graph and keeps every node's result by name."""

    def __init__(self, gm: GraphModule):
        super().__init__(gm)
        self.values: dict[str, object] = {}

    def run_node(self, n):
        out = super().run_node(n)
        self.values[n.name] = out
        return out
