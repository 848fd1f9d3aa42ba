"""Data movement: RESHAPE for view-like ops; permutes only relabel the layout."""

from __future__ import annotations

import torch
from torch.fx import Node

from ..lowering import Lowering, lowers
from ..tosa_graph import Value

aten = torch.ops.aten


def _reshape_rule(ctx: Lowering, node: Node) -> Value:
    return ctx.reshape(ctx.arg(node.args[0]), node.meta["val"].shape, node=node)


for _op in (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.squeeze.dim,
            aten.squeeze.dims, aten.squeeze.default, aten.unsqueeze.default, aten.flatten.using_ints):
    lowers(_op)(_reshape_rule)


@lowers(aten.clone.default, aten.alias.default, aten.contiguous.default)
def copy(ctx: Lowering, node: Node) -> Value:
    """Copies are free in TOSA: values are immutable."""
    return ctx.arg(node.args[0])


@lowers(aten.permute.default)
def permute(ctx: Lowering, node: Node) -> Value:
    """No data moves: the value's layout records the new dimension order."""
    x = ctx.arg(node.args[0])
    dims = [d % x.rank for d in node.args[1]]
    return x.with_(order=tuple(dims.index(d) for d in x.order))
