"""Composite layers as primitive ATen ops (softmax, layer/group/batch norm, vector norms, attention, GLU, LSTM and
GRU), so each step gets its own quantization: ``DECOMPOSE_FOR_ANNOTATION``, which the rewrites before annotation
apply."""

from __future__ import annotations

import torch
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from ..capture import graph_attr, vector_norm_args

aten = torch.ops.aten


class Builder:
    """Adds ATen calls before ``node`` (with fake values and the node's module metadata), and constants."""

    def __init__(self, model: GraphModule, node: Node):
        self.model, self.node = model, node
        self.meta = {k: v for k, v in node.meta.items() if k in ("nn_module_stack", "stack_trace")}
        self.own_qparams: list[Node] = []  # nodes whose output needs its own quantization

    def own(self, node: Node) -> Node:
        """Mark ``node`` (say a mean, which normally shares its input's qparams) to get its own."""
        self.own_qparams.append(node)
        return node

    def __call__(self, target, *args) -> Node:
        with self.model.graph.inserting_before(self.node):
            new = self.model.graph.call_function(target, args)
        new.meta = dict(self.meta)
        new.meta["val"] = target(*map_arg(args, lambda a: a.meta["val"]))
        return new

    def constant(self, suffix: str, value: torch.Tensor) -> Node:
        name = f"_tosakit_{self.node.name}_{suffix}"
        self.model.register_buffer(name, value.detach().clone())
        with self.model.graph.inserting_before(self.node):
            const = self.model.graph.get_attr(name)
        const.meta["val"] = getattr(self.model, name)
        return const


def _softmax_parts(f: Builder, x: Node, dim: int) -> tuple[Node, Node, Node]:
    """max along ``dim``, exp(x - max) and its sum along ``dim``."""
    top = f(aten.amax.default, x, [dim], True)
    e = f(aten.exp.default, f(aten.sub.Tensor, x, top))
    return top, e, f(aten.sum.dim_IntList, e, [dim], True)


def _softmax(f: Builder, x: Node, dim: int) -> Node:
    """exp(x - max) * reciprocal(sum): TABLE ops for exp and reciprocal, REDUCE_SUM between."""
    _, e, total = _softmax_parts(f, x, dim)
    return f(aten.mul.Tensor, e, f(aten.reciprocal.default, total))


def _log_softmax(f: Builder, x: Node, dim: int) -> Node:
    """x - (max + log(sum(exp(x - max)))): x - max feeds only the exp, so Vela runs the SUB, its RESCALE and
    the exp's TABLE as one pass, and the log and the add work on the reduced tensor."""
    top, _, total = _softmax_parts(f, x, dim)
    return f(aten.sub.Tensor, x, f(aten.add.Tensor, top, f(aten.log.default, total)))


def _normalize(f: Builder, x: Node, dims: list[int], eps: float) -> Node:
    """(x - mean) * rsqrt(var + eps) over ``dims``, every step its own op: the mean shares x's quantization (it
    cannot leave x's range), the variance has its own."""
    dev = f(aten.sub.Tensor, x, f(aten.mean.dim, x, dims, True))
    var = f.own(f(aten.mean.dim, f(aten.mul.Tensor, dev, dev), dims, True))
    return f(aten.mul.Tensor, dev, f(aten.rsqrt.default, f(aten.add.Tensor, var, float(eps))))


def _affine(f: Builder, y: Node, weight, bias, shape) -> Node:
    """y * weight + bias with the parameters viewed as ``shape``."""
    if isinstance(weight, Node):
        y = f(aten.mul.Tensor, y, f.constant("weight", graph_attr(f.model, weight).reshape(shape)))
    if isinstance(bias, Node):
        y = f(aten.add.Tensor, y, f.constant("bias", graph_attr(f.model, bias).reshape(shape)))
    return y


def _decompose_softmax(f: Builder, node: Node) -> Node | None:
    if len(node.args) > 2 and node.args[2] not in (None, False):
        return None  # softmax with a dtype conversion stays whole
    x, dim = node.args[:2]
    if node.target == aten.log_softmax.int:
        return _log_softmax(f, x, dim)
    if x.target == aten.masked_fill.Scalar and x.args[2] == float("-inf"):
        return _masked_softmax(f, x, dim)
    return _softmax(f, x, dim)


def _masked_softmax(f: Builder, filled: Node, dim: int) -> Node:
    """softmax(scores.masked_fill(mask, -inf)) as the scores' exp with the masked ones set to 0, over their sum:
    no -inf to quantize (its range would be infinite)."""
    return _masked_weights(f, *filled.args[:2], dim)


def _masked_weights(f: Builder, scores: Node, mask: Node, dim: int) -> Node:
    """softmax of ``scores`` along ``dim`` where ``mask`` leaves a score out: its exp is 0 before the sum. The max
    subtracted is the kept scores' own (the scores less their minimum, the left-out ones zeroed, then the max): a
    left-out score above every kept one (a query against an empty cache slot) would leave the kept exps tiny and
    their sum's reciprocal beyond any range the quantization can hold. A left-out score's difference from that max
    is clamped to 0 before the exp, so the exp's range stays [0, 1]."""
    shifted = f(aten.sub.Tensor, scores, f(aten.amin.default, scores, [dim], True))
    top = f(aten.amax.default, _zero_where(f, mask, shifted), [dim], True)
    below = f(aten.clamp.default, f(aten.sub.Tensor, shifted, top), None, 0.0)
    e = _zero_where(f, mask, f(aten.exp.default, below))
    return f(aten.mul.Tensor, e, f(aten.reciprocal.default, f(aten.sum.dim_IntList, e, [dim], True)))


def _zero_where(f: Builder, mask: Node, x: Node) -> Node:
    """``x`` with 0 where ``mask`` is set: a MUL by the kept positions when the mask is a constant (a causal
    mask; Ethos-U55 has no SELECT), else a where."""
    if mask.op == "get_attr":
        return f(aten.mul.Tensor, x, f.constant("kept", (~graph_attr(f.model, mask).bool()).float()))
    return f(aten.where.ScalarSelf, mask, 0.0, x)


def _decompose_layer_norm(f: Builder, node: Node) -> Node | None:
    x, shape = node.args[0], list(node.args[1])
    args = list(node.args) + [None] * 3
    rank = x.meta["val"].dim()
    y = _normalize(f, x, list(range(rank - len(shape), rank)), args[4] if args[4] is not None else 1e-5)
    return _affine(f, y, args[2], args[3], shape)


def _decompose_group_norm(f: Builder, node: Node) -> Node | None:
    x, groups = node.args[0], node.args[1]
    args = list(node.args) + [None] * 4
    shape = list(x.meta["val"].shape)
    eps = args[4] if args[4] is not None else 1e-5
    if groups in (1, shape[1]):  # one group, or one per channel: no view, so no layout change around it
        y = _normalize(f, x, list(range(1 if groups == 1 else 2, len(shape))), eps)
    else:  # reshape, not view: x may be channels-last in memory
        grouped = f(aten.reshape.default, x, [shape[0], groups, -1])
        y = f(aten.reshape.default, _normalize(f, grouped, [2], eps), shape)
    return _affine(f, y, args[2], args[3], [shape[1]] + [1] * (len(shape) - 2))


def _decompose_batch_norm(f: Builder, node: Node) -> Node | None:
    """Inference batch norm (not folded into a conv) as x * scale + shift per channel."""
    x, weight, bias, mean, var, training = node.args[:6]
    if training or not all(isinstance(a, Node) for a in (mean, var)):
        return None
    eps = node.args[7]
    scale = torch.rsqrt(graph_attr(f.model, var).double() + eps)
    if isinstance(weight, Node):
        scale = scale * graph_attr(f.model, weight).double()
    shift = -graph_attr(f.model, mean).double() * scale
    if isinstance(bias, Node):
        shift = shift + graph_attr(f.model, bias).double()
    shape = [-1] + [1] * (x.meta["val"].dim() - 2)
    y = f(aten.mul.Tensor, x, f.constant("scale", scale.float().reshape(shape)))
    return f(aten.add.Tensor, y, f.constant("shift", shift.float().reshape(shape)))


# Views torch's attention puts between the mask it builds and the attention that reads it.
_MASK_VIEWS = {aten.view.default, aten.reshape.default, aten.expand.default, aten.unsqueeze.default,
               aten._unsafe_view.default}


def _masked_positions(f: Builder, mask: Node) -> Node | None:
    """Where an attention mask leaves a score out, as a bool tensor of the mask's shape: not a boolean mask; or the
    -inf of the additive mask torch builds from a boolean one (``masked_fill`` of zeros), through its views. None
    for any other additive mask."""
    if mask.meta["val"].dtype == torch.bool:
        return f(aten.logical_not.default, mask)
    if mask.op == "get_attr":  # a mask known at export (causal), folded: 0 where kept, -inf where left out
        value = graph_attr(f.model, mask)
        return f.constant("masked", value == float("-inf")) if bool(((value == 0) | value.isneginf()).all()) else None
    views = []
    while mask.op == "call_function" and mask.target in _MASK_VIEWS:
        views.append(mask)
        mask = mask.args[0]
    zeros = mask.args[0] if mask.op == "call_function" and mask.target == aten.masked_fill.Scalar else None
    if zeros is None or mask.args[2] != float("-inf") or getattr(zeros, "target", None) not in (
            aten.zeros_like.default, aten.zeros.default):
        return None
    masked = mask.args[1]
    for view in reversed(views):
        masked = f(view.target, masked, *view.args[1:])
    return masked


def _decompose_sdpa(f: Builder, node: Node) -> Node | None:
    """softmax(q @ k^T * scale) @ v, without dropout or causal masking; a mask's left-out scores weigh 0 (their
    exp set to 0 before the sum: no -inf to quantize)."""
    q, k, v = node.args[:3]
    opts = {**dict(zip(("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"), node.args[3:])), **node.kwargs}
    if opts.get("dropout_p") or opts.get("is_causal") or opts.get("enable_gqa"):
        return None
    masked = opts.get("attn_mask")
    if masked is not None and (masked := _masked_positions(f, masked)) is None:
        return None
    scale = opts.get("scale")
    scale = scale if scale is not None else q.meta["val"].shape[-1] ** -0.5
    scores = f(aten.mul.Tensor, f(aten.matmul.default, q, f(aten.transpose.int, k, -2, -1)), float(scale))
    if masked is None:
        return f(aten.matmul.default, _softmax(f, scores, -1), v)
    return f(aten.matmul.default, _masked_weights(f, scores, masked, -1), v)


def _decompose_glu(f: Builder, node: Node) -> Node:
    """GLU: the first half of x along ``dim`` times the sigmoid of the second."""
    x, dim = node.args[0], (node.args[1] if len(node.args) > 1 else -1)
    half = x.meta["val"].shape[dim] // 2
    gate = f(aten.sigmoid.default, f(aten.slice.Tensor, x, dim, half, 2 * half))
    return f(aten.mul.Tensor, f(aten.slice.Tensor, x, dim, 0, half), gate)


def _initial_state(f: Builder, state: Node, slot: int) -> Node | None:
    """The initial state of one layer and direction, or None when it is zeros (its terms then drop out)."""
    if state.target in (aten.zeros.default, aten.zeros_like.default) or (
            state.op == "get_attr" and not graph_attr(f.model, state).any()):
        return None
    return f(aten.select.int, state, 0, slot)


class _Gates:
    """One recurrent layer's weights, split per gate: W_ih x + b for all steps, W_hh h per step."""

    def __init__(self, f: Builder, params: list[Node], slot: int, count: int, biases: bool):
        per = 4 if biases else 2
        w_ih, w_hh = (graph_attr(f.model, p) for p in params[per * slot: per * slot + 2])
        b_ih, b_hh = ((graph_attr(f.model, p) for p in params[per * slot + 2: per * slot + 4]) if biases
                      else (torch.zeros(w_ih.shape[0]), torch.zeros(w_ih.shape[0])))
        self.f, self.size = f, w_hh.shape[1]
        rows = [slice(k * self.size, (k + 1) * self.size) for k in range(count)]
        name = f"l{slot}"
        self.w_ih = [f.constant(f"{name}_w_ih{k}", w_ih[r]) for k, r in enumerate(rows)]
        self.w_hh = [f.constant(f"{name}_w_hh{k}", w_hh[r]) for k, r in enumerate(rows)]
        self.b_ih = [b_ih[r] for r in rows]
        self.b_hh = [b_hh[r] for r in rows]
        self.name = name

    def inputs(self, seq: Node, k: int, with_hidden_bias: bool) -> Node:
        """W_ih x + b_ih (+ b_hh) of gate ``k`` for every time step at once."""
        bias = self.b_ih[k] + self.b_hh[k] if with_hidden_bias else self.b_ih[k]
        return self.f(aten.linear.default, seq, self.w_ih[k], self.f.constant(f"{self.name}_b{k}", bias))

    def hidden(self, h: Node, k: int, bias: bool = False) -> Node:
        """W_hh h (+ b_hh) of gate ``k`` at one step."""
        b = self.f.constant(f"{self.name}_b_hh{k}", self.b_hh[k]) if bias else None
        return self.f(aten.linear.default, h, self.w_hh[k], b)


def _lstm_step(f: Builder, xs: list[Node], g: _Gates, h: Node | None, c: Node | None) -> tuple[Node, Node]:
    """i, f, g, o gates; c' = f * c + i * g; h' = o * tanh(c')."""
    pre = [x if h is None else f(aten.add.Tensor, x, g.hidden(h, k)) for k, x in enumerate(xs)]
    i, fg, o = (f(aten.sigmoid.default, pre[k]) for k in (0, 1, 3))
    cand = f(aten.tanh.default, pre[2])
    c = f(aten.mul.Tensor, i, cand) if c is None else f(aten.add.Tensor, f(aten.mul.Tensor, fg, c),
                                                         f(aten.mul.Tensor, i, cand))
    return f(aten.mul.Tensor, o, f(aten.tanh.default, c)), c


def _gru_step(f: Builder, xs: list[Node], g: _Gates, h: Node | None) -> Node:
    """r, z gates; n = tanh(x_n + r * (W_hn h + b_hn)); h' = n + z * (h - n)."""
    r, z = (f(aten.sigmoid.default, xs[k] if h is None else f(aten.add.Tensor, xs[k], g.hidden(h, k)))
            for k in (0, 1))
    hn = g.hidden(h, 2, bias=True) if h is not None else f.constant(f"{g.name}_b_hn", g.b_hh[2])
    n = f(aten.tanh.default, f(aten.add.Tensor, xs[2], f(aten.mul.Tensor, r, hn)))
    if h is None:
        return f(aten.sub.Tensor, n, f(aten.mul.Tensor, z, n))
    return f(aten.add.Tensor, n, f(aten.mul.Tensor, z, f(aten.sub.Tensor, h, n)))


def _decompose_rnn(f: Builder, node: Node) -> tuple[Node, ...] | None:
    """nn.LSTM / nn.GRU (inference; one or two directions) unrolled over time: per-gate linears, sigmoid/tanh,
    products and sums, every one its own op with its own quantization. A bidirectional layer runs a second set of
    weights from the last step back and concatenates its outputs after the forward ones."""
    x, hx, params, biases, layers, _, train, bidirectional, batch_first = node.args
    if train:
        return None
    lstm = node.target == aten.lstm.input
    count, time_dim, directions = (4 if lstm else 3), (1 if batch_first else 0), (2 if bidirectional else 1)
    steps = x.meta["val"].shape[time_dim]
    seq, finals = x, ([], [])
    for layer in range(layers):
        outputs = []
        for direction in range(directions):
            slot = layer * directions + direction  # PyTorch's order of weights and states
            g = _Gates(f, params, slot, count, biases)
            projected = [g.inputs(seq, k, with_hidden_bias=lstm or k < 2) for k in range(count)]
            h = _initial_state(f, hx[0] if lstm else hx, slot)
            c = _initial_state(f, hx[1], slot) if lstm else None
            outs = [None] * steps
            for t in (reversed(range(steps)) if direction else range(steps)):
                xs = [f(aten.select.int, p, time_dim, t) for p in projected]
                h, c = _lstm_step(f, xs, g, h, c) if lstm else (_gru_step(f, xs, g, h), None)
                outs[t] = h
            outputs.append(f(aten.stack.default, outs, time_dim))
            finals[0].append(h)
            finals[1].append(c)
        seq = outputs[0] if directions == 1 else f(aten.cat.default, outputs, -1)
    states = [f(aten.stack.default, finals[0], 0)] + ([f(aten.stack.default, finals[1], 0)] if lstm else [])
    return (seq, *states)


def _decompose_vector_norm(f: Builder, node: Node) -> Node | None:
    """The 2-norm as sqrt(sum(x * x)), the 1-norm as sum(|x|), the inf-norm as amax(|x|), each sum with its own
    quantization (XCiT's and CLIP's F.normalize); other orders, or a dtype conversion, stay whole."""
    x, order, dims, keep = vector_norm_args(node)
    if order == 2:
        return f(aten.sqrt.default, f.own(f(aten.sum.dim_IntList, f(aten.mul.Tensor, x, x), dims, keep)))
    if order == 1:
        return f.own(f(aten.sum.dim_IntList, f(aten.abs.default, x), dims, keep))
    if order == float("inf"):
        return f(aten.amax.default, f(aten.abs.default, x), dims, keep)
    return None


DECOMPOSE_FOR_ANNOTATION = {
    aten.softmax.int: _decompose_softmax,
    aten._softmax.default: _decompose_softmax,
    aten.log_softmax.int: _decompose_softmax,
    aten.layer_norm.default: _decompose_layer_norm,
    aten.group_norm.default: _decompose_group_norm,
    aten.batch_norm.default: _decompose_batch_norm,
    aten.scaled_dot_product_attention.default: _decompose_sdpa,
    aten.glu.default: _decompose_glu,
    aten.linalg_vector_norm.default: _decompose_vector_norm,
    aten.lstm.input: _decompose_rnn,
    aten.gru.input: _decompose_rnn,
}
