"""Pairing nodes across graphs by what they compute (value numbering): the lowered program's, the
fake-quantized model's and the float model's nodes get the same key when they compute the same value."""

from __future__ import annotations

import torch
from torch.fx import Node

from ..quantize.qdq import is_dequantize, is_quantize

aten = torch.ops.aten

SAME_VALUE = {aten.clone.default, aten.alias.default, aten.detach.default, aten.contiguous.default,
              aten.lift_fresh_copy.default}
RESHAPES = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.dim,
            aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.flatten.using_ints,
            aten.unflatten.int}


def _shape(node) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return tuple(val.shape) if isinstance(val, torch.Tensor) else None


def _integer_cast(node: Node) -> bool:
    """A cast between integer dtypes (the int64 token ids a delegate takes as int32): the same values."""
    if node.target != aten._to_copy.default or not isinstance(node.args[0], Node):
        return False
    vals = [n.meta.get("val") for n in (node, node.args[0])]
    return all(isinstance(v, torch.Tensor) and not v.dtype.is_floating_point and v.dtype != torch.bool for v in vals)


class Keys:
    """Value numbering shared by several graphs: two nodes get the same key when they compute the same
    function of the model's inputs. Quantize, dequantize and copies are looked through, chains of reshapes
    and of permutes are composed (two graphs often split them differently), and constants are keys by
    value: a quantized one is the float one it is within half a quantization step of."""

    def __init__(self):
        self.ids: dict[object, int] = {}
        self.alternatives: dict[int, tuple[int, ...]] = {}  # a constant's key -> other float constants it matches

    def intern(self, key) -> int:
        return self.ids.setdefault(key, len(self.ids))

    def unique(self) -> int:
        return self.intern(object())


class Numbering:
    """Keys of one graph's nodes, in graph order; ``const_key(node)`` gives a constant node's key."""

    def __init__(self, keys: Keys, const_key):
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
        same = is_quantize(node) or is_dequantize(node) or t in SAME_VALUE or _integer_cast(node)
        if same and isinstance(a0, Node):
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
        return self.keys.intern(self._op_key(node))

    def _op_key(self, node: Node) -> tuple:
        """The op and its arguments' keys; a constant argument that matches several float constants takes the
        one that makes a key already known (the float graph's op)."""
        key = self._op_tuple(node, {})
        if key in self.keys.ids:
            return key
        for a in node.all_input_nodes:
            for alternative in self.keys.alternatives.get(self.get(a), ()):
                other = self._op_tuple(node, {a: alternative})
                if other in self.keys.ids:
                    return other
        return key

    def _op_tuple(self, node: Node, override: dict) -> tuple:
        return (str(node.target), self._norm(node.args, override),
                self._norm(dict(sorted(node.kwargs.items())), override))

    def _norm(self, a, override: dict | None = None):
        if isinstance(a, Node):
            return ("node", override[a] if override and a in override else self.get(a))
        if isinstance(a, (list, tuple)):
            return tuple(self._norm(x, override) for x in a)
        if isinstance(a, dict):
            return tuple((k, self._norm(v, override)) for k, v in a.items())
        try:
            hash(a)
            return a
        except TypeError:
            return repr(a)
