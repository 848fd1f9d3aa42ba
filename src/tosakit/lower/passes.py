"""Graph passes, each ``GraphModule -> GraphModule``, and the pipeline every target runs."""

from __future__ import annotations

import operator

import torch
from torch.fx import GraphModule, Node

from ..capture import STATE, State, fold_constants, graph_attr, promote_constants, state_writes
from ..quantize.qdq import INTEGER_KEY, PASSTHROUGH, fused_activation_of, is_dequantize, is_quantize, qparams_of
from .lowering import folds_to_integer

aten = torch.ops.aten
_Q = torch.ops.quantized_decomposed.quantize_per_tensor.default
_DQ = torch.ops.quantized_decomposed.dequantize_per_tensor.default

# Identity in value and in memory layout (copies that change contiguity stay: PyTorch needs them).
NOOPS = {
    aten.dropout.default,
    aten.detach.default,
    aten.lift_fresh_copy.default,
}
ASSERTS = {
    aten._assert_tensor_metadata.default,
    aten._assert_scalar.default,
    aten.sym_constrain_range_for_size.default,
}


def _finish(gm: GraphModule) -> GraphModule:
    """Tidy the graph after a pass; ``run`` regenerates the code once, after the last pass."""
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    return gm


def _is_identity_expand(node: Node) -> bool:
    """An expand whose output has its input's shape (torch.matmul leaves these before bmm)."""
    if node.target != aten.expand.default or not isinstance(node.args[0], Node):
        return False
    src, out = node.args[0].meta.get("val"), node.meta.get("val")
    return src is not None and out is not None and tuple(src.shape) == tuple(out.shape)


def _empty(node) -> bool:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return val is not None and val.numel() == 0


def remove_noops(gm: GraphModule) -> GraphModule:
    """Drop eval-mode dropout, detaches, expands to the same shape, shape assertions and a cat's empty inputs (a
    KV cache's first concatenation)."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function":
            continue
        if node.target == aten.cat.default and any(map(_empty, node.args[0])) and not _empty(node):
            node.args = ([a for a in node.args[0] if not _empty(a)], *node.args[1:])  # one left: a copy
        elif node.target in ASSERTS:
            gm.graph.erase_node(node)
        elif _is_identity_expand(node):
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
        elif node.target in NOOPS and isinstance(node.args[0], Node):
            if node.target == aten.dropout.default and len(node.args) > 2 and node.args[2]:
                continue  # training-mode dropout is not a no-op
            node.replace_all_uses_with(node.args[0])
            gm.graph.erase_node(node)
    return _finish(gm)


def remove_requantize_noops(gm: GraphModule) -> GraphModule:
    """quantize(dequantize(x)) with the same parameters is x (left behind by removed no-ops)."""
    for node in list(gm.graph.nodes):
        if not is_quantize(node) or not is_dequantize(node.args[0]):
            continue
        dq = node.args[0]
        if list(node.args[1:]) == list(dq.args[1:]) and node.kwargs == dq.kwargs:
            node.replace_all_uses_with(dq.args[0])
            gm.graph.erase_node(node)
    return _finish(gm)


def duplicate_dequantize(gm: GraphModule) -> GraphModule:
    """Give every dequantize node a single user, so each consumer decides its own fate."""
    for node in list(gm.graph.nodes):
        if not is_dequantize(node) or len(node.users) <= 1:
            continue
        for user in list(node.users)[1:]:
            with gm.graph.inserting_before(user):
                copy = gm.graph.node_copy(node)
            user.replace_input_with(node, copy)
    return _finish(gm)


def split_dequantized(gm: GraphModule) -> GraphModule:
    """A dequantized tensor split in parts becomes a dequantize and a slice per part, so each part joins the
    delegate that reads it (GPT-2's fused q, k, v: a part whose reader stayed on the CPU held the split's
    delegate to a float output)."""
    for node in list(gm.graph.nodes):
        if node.target not in (aten.split_with_sizes.default, aten.split.Tensor) or node.args[0].target != _DQ:
            continue
        dq, shape = node.args[0], node.args[0].meta["val"].shape
        dim = (node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) % len(shape)
        sizes = node.args[1] if node.target == aten.split_with_sizes.default else \
            [min(node.args[1], shape[dim] - start) for start in range(0, shape[dim], node.args[1])]
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        for item in list(node.users):
            i = item.args[1]
            with gm.graph.inserting_before(item):
                part = gm.graph.call_function(aten.slice.Tensor, (gm.graph.node_copy(dq), dim, starts[i],
                                                                  starts[i] + sizes[i]))
            part.args[0].meta = dict(dq.meta)
            part.meta = dict(item.meta)
            item.replace_all_uses_with(part)
            gm.graph.erase_node(item)
        gm.graph.erase_node(node)
        if not dq.users:
            gm.graph.erase_node(dq)
    return _finish(gm)


def _moves_data(node) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node.target in PASSTHROUGH \
        and node.target is not operator.getitem


def _chain_dequantize(node: Node) -> Node | None:
    """The per-tensor dequantize at the start of a chain of data movement ending at ``node``."""
    while _moves_data(node):
        node = node.args[0]
    return node if isinstance(node, Node) and node.target == _DQ else None


def _chain_quantize(node: Node) -> Node | None:
    """The per-tensor quantize at the end of a chain of single-use data movement starting at ``node``."""
    while _moves_data(node) and len(node.users) == 1:
        node = next(iter(node.users))
    return node if node.target == _Q else None


def _insert_requantize(gm: GraphModule, after: Node, like: Node, users: list[Node]) -> None:
    """quantize + dequantize with ``like``'s parameters after ``after``, feeding ``users``."""
    with gm.graph.inserting_after(after):
        q = gm.graph.call_function(_Q, (after, *like.args[1:]), dict(like.kwargs))
    with gm.graph.inserting_after(q):
        dq = gm.graph.call_function(_DQ, (q, *like.args[1:]), dict(like.kwargs))
    q.meta = {**after.meta, "val": torch.empty(tuple(after.meta["val"].shape), dtype=like.args[5])}
    dq.meta = dict(after.meta)
    for user in users:
        user.replace_input_with(after, dq)


def requantize_around_data_movement(gm: GraphModule) -> GraphModule:
    """Quantize data movement between an integer op and its quantized input or output (same
    parameters, so no value changes): view(dequantize(x)) -> matmul gets its own dequantize."""
    for node in list(gm.graph.nodes):
        if not _moves_data(node):
            continue
        computing = [u for u in node.users if u.target != _Q and not _moves_data(u)]
        dq = _chain_dequantize(node)
        if dq is not None and computing:
            _insert_requantize(gm, node, dq, computing)
        src = node.args[0]
        q = _chain_quantize(node)
        if q is not None and isinstance(src, Node) and src.op == "call_function" and not _moves_data(src) \
                and src.target != _DQ:
            _insert_requantize(gm, src, q, [node])
    return _finish(gm)


def _finite_scores(node) -> bool:
    """Attention scores that cannot hold -inf: matmul results, scaled or reshaped (no mask added)."""
    finite = {aten.bmm.default, aten.mm.default, aten.view.default, aten._unsafe_view.default, aten.mul.Scalar,
              aten.mul.Tensor, aten.div.Scalar}
    while isinstance(node, Node) and node.target in finite - {aten.bmm.default, aten.mm.default}:
        node = node.args[0]
    return isinstance(node, Node) and node.target in finite


def _safe_softmax_of(where: Node) -> Node | None:
    """The softmax in where(all(scores == -inf), 0, softmax(scores)), the guard sdpa's decomposition adds."""
    if where.target != aten.where.self or len(where.args) != 3:
        return None
    cond, _, soft = where.args
    chain = [aten.logical_not.default, aten.any.dim, aten.logical_not.default, aten.eq.Scalar]
    for target in chain:
        if not isinstance(cond, Node) or cond.target != target:
            return None
        scores, cond = cond.args[0], cond.args[0]
    ok = soft.target == aten._softmax.default and soft.args[0] is scores and _finite_scores(scores)
    return soft if ok else None


def remove_safe_softmax_guard(gm: GraphModule) -> GraphModule:
    """Drop sdpa's guard for rows of -inf scores where the scores come from a matmul with no mask."""
    for node in list(gm.graph.nodes):
        soft = _safe_softmax_of(node) if node.op == "call_function" else None
        if soft is not None:
            node.replace_all_uses_with(soft)
            gm.graph.erase_node(node)
    return _finish(gm)


def fold_batch_norm(gm: GraphModule) -> GraphModule:
    """Fold inference batch norm into the float convolution before it."""
    bn_op = aten._native_batch_norm_legit_no_training.default
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target != bn_op:
            continue
        conv = node.args[0]
        if not (isinstance(conv, Node) and conv.target == aten.convolution.default and len(conv.users) == 1):
            continue
        w_node, b_node = conv.args[1], conv.args[2]
        if w_node.op != "get_attr" or (b_node is not None and b_node.op != "get_attr"):
            continue
        if conv.args[6]:  # transposed convolution: channels on dim 1; left to the batch-norm rule
            continue
        gamma, beta, mean, var = (graph_attr(gm, a) if isinstance(a, Node) else None for a in node.args[1:5])
        eps = node.args[6]
        w = graph_attr(gm, w_node)
        b = graph_attr(gm, b_node) if b_node is not None else torch.zeros(w.shape[0])
        inv = torch.rsqrt(var + eps) * (gamma if gamma is not None else 1.0)
        new_w = w * inv.reshape(-1, *([1] * (w.dim() - 1)))
        new_b = (b - mean) * inv + (beta if beta is not None else 0.0)
        prefix = f"_bnfold_{conv.name}"
        gm.register_buffer(prefix + "_w", new_w.detach())
        gm.register_buffer(prefix + "_b", new_b.detach())
        with gm.graph.inserting_before(conv):
            nw, nb = gm.graph.get_attr(prefix + "_w"), gm.graph.get_attr(prefix + "_b")
        nw.meta["val"], nb.meta["val"] = new_w, new_b
        conv.args = (conv.args[0], nw, nb, *conv.args[3:])
        for user in list(node.users):
            if user.target is operator.getitem and user.args[1] == 0:
                user.replace_all_uses_with(conv)
    return _finish(gm)


def fuse_integer_activations(gm: GraphModule) -> GraphModule:
    """Run clamp-like activations inside the integer op before them (one output rescale + clamp)."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not folds_to_integer(node):
            continue
        act = fused_activation_of(node)
        if act is None:
            continue
        node.meta["tosakit_clamp"] = clamp_bounds(act)
        node.meta["tosakit_fused"] = act.name  # the PyTorch node whose value this op now produces
        node.meta["val"] = act.meta.get("val", node.meta.get("val"))
        act.replace_all_uses_with(node)
        gm.graph.erase_node(act)
    return _finish(gm)


def clamp_bounds(act: Node) -> tuple[float | None, float | None]:
    """The (min, max) in real units an activation clamps to."""
    t = act.target
    if t in (aten.relu.default, aten.relu_.default):
        return 0.0, None
    if t == aten.relu6.default:
        return 0.0, 6.0
    if t in (aten.hardtanh.default, aten.hardtanh_.default):
        args = list(act.args) + [None] * 3
        return float(args[1] if args[1] is not None else -1.0), float(args[2] if args[2] is not None else 1.0)
    lo = act.args[1] if len(act.args) > 1 else act.kwargs.get("min")
    hi = act.args[2] if len(act.args) > 2 else act.kwargs.get("max")
    return (None if lo is None else float(lo)), (None if hi is None else float(hi))


def fold_quantize_dequantize(gm: GraphModule) -> GraphModule:
    """Integer ops consume and produce integers: fold their dequantize inputs and quantize outputs.

    The qparams move to ``node.meta['tosakit_q']`` of the integer tensor they describe.
    Quantize/dequantize nodes next to float ops stay, and lower as explicit conversions.
    """
    integer = {n for n in gm.graph.nodes if folds_to_integer(n)}
    for n in integer:
        n.meta[INTEGER_KEY] = True
    for node in list(gm.graph.nodes):
        if is_dequantize(node) and all(u in integer for u in node.users):
            src = node.args[0]
            src.meta["tosakit_q"] = qparams_of(node, gm)
            node.replace_all_uses_with(src)
            gm.graph.erase_node(node)
    for node in list(gm.graph.nodes):
        if is_quantize(node) and node.args[0] in integer:
            producer = node.args[0]
            q = qparams_of(node, gm)
            old = producer.meta.get("tosakit_q")
            if old is not None and (old.s, old.zp) != (q.s, q.zp):
                continue  # a second, different quantization of the same value stays explicit
            producer.meta["tosakit_q"] = q
            node.replace_all_uses_with(producer)
            gm.graph.erase_node(node)
    return _finish(gm)


def quantized_io(gm: GraphModule) -> GraphModule:
    """The program takes and returns integers: drop the quantize after each input, the dequantize before
    each output, and record their parameters in ``gm.meta['io_quantization']``."""
    io = {"inputs": [], "outputs": []}
    for node in [n for n in gm.graph.nodes if n.op == "placeholder"]:
        users = list(node.users)
        if not users or not all(is_quantize(u) and u.args[1:] == users[0].args[1:] for u in users):
            io["inputs"].append(None)
            continue
        q = qparams_of(users[0], gm)
        node.meta["val"] = node.meta["val"].to(q.dtype)
        for u in users:
            u.replace_all_uses_with(node)
            gm.graph.erase_node(u)
        io["inputs"].append(q)
    out = next(n for n in gm.graph.nodes if n.op == "output")
    results = []
    for value in out.args[0]:
        if is_dequantize(value) and len(value.users) == 1:
            io["outputs"].append(qparams_of(value, gm))
            results.append(value.args[0])
        else:
            io["outputs"].append(None)
            results.append(value)
    out.args = (tuple(results),)
    gm.meta["io_quantization"] = io
    return _finish(gm)


def quantized_state(gm: GraphModule) -> GraphModule:
    """State kept as integers: a buffer read only through one quantization and written back from a dequantization
    with the same parameters is stored quantized (its initial value quantized once, here), so neither conversion
    runs on the CPU."""
    out = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    results = list(out.args[0])
    first = len(results) - len(state_writes(gm.graph))
    for k, (buffer, value) in enumerate(state_writes(gm.graph)):
        reads = list(buffer.users)
        if not (reads and is_dequantize(value) and all(is_quantize(r) and r.args[1:] == value.args[1:] for r in reads)):
            continue
        q = qparams_of(value, gm)
        buffer.meta[STATE] = State(buffer.meta[STATE].name, q.quantize(buffer.meta[STATE].initial))
        buffer.meta["val"] = buffer.meta["val"].to(q.dtype)
        for r in reads:
            r.replace_all_uses_with(buffer)
            gm.graph.erase_node(r)
        results[first + k] = value.args[0]
    out.args = (tuple(results),)
    return _finish(gm)


# What runs before partitioning (whole program) and inside each partition before lowering.
PROGRAM_PIPELINE = [remove_noops, fold_constants, promote_constants, remove_requantize_noops,
                    remove_safe_softmax_guard, fold_batch_norm, split_dequantized, requantize_around_data_movement,
                    duplicate_dequantize, quantized_state]
PARTITION_PIPELINE = [fuse_integer_activations, fold_quantize_dequantize]


def run(passes, gm: GraphModule) -> GraphModule:
    """Run passes in order."""
    for p in passes:
        gm = p(gm)
    gm.recompile()
    return gm
