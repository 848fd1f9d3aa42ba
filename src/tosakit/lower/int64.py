"""TOSA has no int64: index arithmetic in int64 (Hugging Face's token ids, RoBERTa's position ids computed from
them) is narrowed to int32 so it runs in a delegate, with a cast on the CPU where the narrowed values start and
where an op that needs int64 reads them. Ids and positions are far below 2**31."""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node

from ..capture import graph_attr, written_attrs
from ..partition.partitioner import IDS_CAST
from ..specs import TosaSpecification
from .lowering import RULES

aten = torch.ops.aten

# int64 results that follow their int64 inputs: narrowed with them
FOLLOW = {
    aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.neg.default, aten.clamp.default, aten.maximum.default,
    aten.minimum.default, aten.where.self, aten.slice.Tensor, aten.select.int, aten.expand.default, aten.view.default,
    aten.reshape.default, aten.unsqueeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.permute.default,
    aten.cat.default, aten.gather.default, aten.index_select.default, aten.repeat.default, aten.clone.default,
}
# ops that read int32 as they read int64, their result unchanged (ids, indices, comparisons)
TAKE = {
    aten.embedding.default, aten.ne.Scalar, aten.ne.Tensor, aten.eq.Scalar, aten.eq.Tensor, aten.lt.Scalar,
    aten.lt.Tensor, aten.le.Scalar, aten.le.Tensor, aten.gt.Scalar, aten.gt.Tensor, aten.ge.Scalar, aten.ge.Tensor,
}
# ops whose dtype argument makes their result int32
RETYPE = {aten._to_copy.default, aten.cumsum.default, aten.sum.dim_IntList}


def _int64(node) -> bool:
    return isinstance(node, Node) and getattr(node.meta.get("val"), "dtype", None) is torch.int64


def _cast(gm: GraphModule, value: Node, dtype: torch.dtype, before: Node) -> Node:
    with gm.graph.inserting_before(before):
        cast = gm.graph.call_function(aten._to_copy.default, (value,), {"dtype": dtype})
    cast.meta.update(val=value.meta["val"].to(dtype), stack_trace=before.meta.get("stack_trace"))
    cast.meta[IDS_CAST] = True
    return cast


class _Narrowing:
    """The int32 form of each int64 value narrowed so far."""

    def __init__(self, gm: GraphModule):
        self.gm, self.int32, self.written = gm, {}, written_attrs(gm.graph)
        self.first = next(n for n in gm.graph.nodes if n.op != "placeholder")

    def was_int64(self, value: Node) -> bool:
        """int64 in the model (now int32 if narrowed in place)."""
        return _int64(value) or self.int32.get(value) is value

    def source(self, value: Node) -> Node | None:
        """``value``'s int32 form: a cast of an input (at the top), an int32 copy of a constant, or None."""
        if value not in self.int32:
            if value.op == "placeholder":
                self.int32[value] = _cast(self.gm, value, torch.int32, self.first)
            elif value.op == "get_attr" and value.target not in self.written:
                data = graph_attr(self.gm, value)
                if data.numel() and (data.min() < -2**31 or data.max() >= 2**31):
                    return None
                name = f"{value.target.replace('.', '_')}_int32"
                while hasattr(self.gm, name):
                    name += "_"
                self.gm.register_buffer(name, data.to(torch.int32))
                with self.gm.graph.inserting_after(value):
                    self.int32[value] = self.gm.graph.get_attr(name)
                self.int32[value].meta.update(value.meta, val=value.meta["val"].to(torch.int32))
        return self.int32.get(value)

    def narrow(self, node: Node) -> None:
        """Narrow ``node``'s int64 inputs when all of them narrow and it reads int32 alike (its int64 result, if any,
        becomes int32: a dtype argument says so where there is one); else it reads a cast back to int64 of each
        input narrowed in place."""
        inputs = [a for a in node.all_input_nodes if self.was_int64(a)]
        forms = {a: self.source(a) for a in inputs}
        if not (all(forms.values()) and node.target in TAKE | FOLLOW | RETYPE):
            for a in inputs:
                if self.int32.get(a) is a:  # narrowed in place: this reader takes int64 back
                    node.replace_input_with(a, _cast(self.gm, a, torch.int64, node))
            return
        for a, form in forms.items():
            if form is not a:
                node.replace_input_with(a, form)
        if _int64(node):
            if node.target in RETYPE:
                node.kwargs = {**node.kwargs, "dtype": torch.int32}
            node.meta["val"] = node.meta["val"].to(torch.int32)
            self.int32[node] = node


def int32_ids(gm: GraphModule, spec: TosaSpecification) -> GraphModule:
    """int64 ids and the index arithmetic on them narrowed to int32 (casts on the CPU where it starts and where
    int64 is needed again), when the lowering table lets ``spec`` run an embedding's GATHER; the program still
    takes and gives int64, as the model does."""
    if spec.is_u55_subset and not RULES[aten.embedding.default].support.u55:
        return gm
    narrowing = _Narrowing(gm)
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and not node.meta.get(IDS_CAST) and (
                any(map(narrowing.was_int64, node.all_input_nodes)) or node.target in RETYPE and _int64(node)):
            narrowing.narrow(node)
        elif node.op == "output":
            for a in [a for a in node.all_input_nodes if narrowing.int32.get(a) is a]:
                node.replace_input_with(a, _cast(gm, a, torch.int64, node))
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    return gm
