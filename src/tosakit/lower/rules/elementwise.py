"""Elementwise arithmetic, activations, constants and casts.

Float: the TOSA FP op, or a small composition of them (gelu through ERF or TANH,
silu = x * sigmoid(x), ...). Integer: linear ops rescale their int8 operands
through int32; any other function of one input is an int8 TABLE built from the
ATen op itself, so it matches PyTorch on every one of the 256 inputs (and for the
functions of INT16_TABLES an interpolating int16 TABLE).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.fx import Node

from ...quantize.qdq import INDEX_RESULT_OPS, QParams, integer_dtype
from ..lowering import F32_MAX, NAN_PROPAGATE, Lowering, int_dtype, lowers, quantized_bounds
from ..tosa_graph import TORCH_TO_TOSA, DType, Op, Value, is_float, make_attr, quantize_multiplier

aten = torch.ops.aten
ADD_SHIFT = 20  # headroom bits when int8 operands meet in int32
ADD_SHIFT_INT16 = 15  # int16 operands: 16 + 15 bits, and their sum, still fit in int32
# Operands on one scale meet in int32 shifted left by 14 bits, not ADD_SHIFT - 1 = 19: the same integers out
# (see _exact_coarser), and Vela fuses the input RESCALEs into the NPU Add only when each is a 16-bit
# multiplier with shift 0 after it folds a power of two into the multiplier (regor's
# EthosU55Constraints::SupportsFusedRescale); 2**19 is not, and costs two elementwise ops per input on
# Ethos-U55/U65. Unequal scales take regor's other (advanced) path and keep ADD_SHIFT.
EQUAL_SCALE_SHIFT = 14
MAX_MERGED_DIM = 65536  # the largest dim merged_broadcast makes (an Ethos-U feature map's height, width or depth)
BOOL_RESULT = {Op.EQUAL, Op.GREATER, Op.GREATER_EQUAL, Op.LOGICAL_AND, Op.LOGICAL_OR, Op.LOGICAL_XOR,
               Op.LOGICAL_NOT}
ATTRS = {Op.MAXIMUM: make_attr("MaximumAttribute", NAN_PROPAGATE),
         Op.MINIMUM: make_attr("MinimumAttribute", NAN_PROPAGATE)}


# ------------------------------------------------------------------ building blocks


def broadcast(ctx: Lowering, *vals: Value) -> list[Value]:
    """Operands at one rank and layout (lower-rank ones gain leading size-1 dims, as in PyTorch)."""
    rank = max(v.rank for v in vals)
    vals = [v if v.rank == rank else ctx.reshape(v, (1,) * (rank - v.rank) + v.torch_shape) for v in vals]
    return ctx.same_order(*vals)


def merged_broadcast(shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]] | None:
    """Operand shapes of one broadcasting elementwise op with each run of adjacent dims that every operand keeps
    whole or broadcasts alike merged into one dim (size-1 dims of the result dropped); None when no two dims merge
    or nothing broadcasts. Vela's Ethos-U55 reads a constant broadcast over two dims again and again: a
    [1, 64, 1, 1] constant times [1, 64, 112, 112] takes 6.4 M cycles, as [1, 64, 1] times [1, 64, 12544] 1.6 M."""
    out = [max(dims) for dims in zip(*shapes)]
    dims = [d for d, size in enumerate(out) if size != 1]
    runs: list[list[int]] = []
    for d in dims:
        if runs and all((s[d] == 1) == (s[runs[-1][0]] == 1) for s in shapes) and \
                math.prod(out[e] for e in runs[-1]) * out[d] <= MAX_MERGED_DIM:
            runs[-1].append(d)
        else:
            runs.append([d])
    if all(len(run) == 1 for run in runs) or not any(s[d] == 1 for s in shapes for d in dims):
        return None
    return [tuple(math.prod(s[d] for d in run) for run in runs) or (1,) for s in shapes]


def _constant(ctx: Lowering, v: Value) -> bool:
    """Whether ``v`` is a constant, maybe reshaped or rescaled."""
    name = v.name
    while ctx.g.info[name].data is None:
        op = ctx.g.producer.get(name)
        if op is None or op.op not in ("RESHAPE", "RESCALE"):
            return False
        name = op.inputs[0].name
    return True


def binary(ctx: Lowering, op, vals: list[Value], shape, dtype, q: QParams | None = None,
           node: Node | None = None) -> Value:
    """``op`` on operands of one rank and layout (MUL gains its shift). On Ethos-U55/U65, when a constant that is
    no single number broadcasts, the operands go in at their merged shapes (``merged_broadcast``) and the result
    comes back by a RESHAPE. Only then: an operand in SRAM costs the same either way, Ethos-U85 reads a constant
    as fast in any shape, and a RESHAPE after an op keeps Vela from writing its result into a following PAD's
    buffer."""
    extra = [ctx.g.const(np.zeros(1, np.int8), DType.INT8)] if op == Op.MUL else []
    merged = merged_broadcast([v.shape for v in vals]) if ctx.spec.is_u55_subset else None
    out_shape = tuple(max(dims) for dims in zip(*merged)) if merged else None
    if merged is None or not any(_constant(ctx, v) for v, s in zip(vals, merged) if s != out_shape and max(s) > 1):
        return ctx.emit(op, vals + extra, shape, dtype, like=vals[0], q=q, attr=ATTRS.get(op), node=node)
    flat = [ctx.relayout(v, s, tuple(range(len(s))), node) for v, s in zip(vals, merged)]
    out = ctx.emit(op, flat + extra, out_shape, dtype, like=flat[0], q=q, attr=ATTRS.get(op), node=node)
    return ctx.relayout(out, shape, vals[0].order, node)


def ew(ctx: Lowering, op, *operands, q: QParams | None = None, node: Node | None = None) -> Value:
    """One elementwise TOSA op with PyTorch broadcasting; numbers become constants of the tensors' type."""
    like = next(o for o in operands if isinstance(o, Value))
    vals = broadcast(ctx, *(o if isinstance(o, Value) else ctx.scalar(o, like) for o in operands))
    shape = tuple(max(dims) for dims in zip(*(v.shape for v in vals)))
    return binary(ctx, op, vals, shape, DType.BOOL if op in BOOL_RESULT else vals[-1].dtype, q, node)


def scaled(ctx: Lowering, v: Value, k: float, node: Node | None = None) -> Value:
    """v * k (no op when k is 1)."""
    return v if k == 1 else ew(ctx, Op.MUL, v, float(k), node=node)


def to_q(ctx: Lowering, v: Value, q: QParams) -> Value:
    """``v`` requantized to ``q`` (a RESCALE unless it already has that scale and zero point)."""
    if (v.q.s, v.q.zp) == (q.s, q.zp):
        return v
    return ctx.rescale(v, v.q.s / q.s, int_dtype(q), v.q.zp, q.zp, q=q)


def arg(node: Node, index: int, name: str, default):
    """Argument ``index`` (or keyword ``name``) of an ATen call."""
    return node.args[index] if len(node.args) > index else node.kwargs.get(name, default)


def _same_function(node: Node):
    """The node's ATen op as a function of its first input, other arguments fixed (for TABLEs)."""
    return lambda t: node.target(t, *node.args[1:], **node.kwargs)


def activation(fp):
    """Rule for a function of one input: an int8 TABLE when quantized, else ``fp(ctx, x, node)`` in float."""

    def rule(ctx: Lowering, node: Node) -> Value:
        x = ctx.arg(node.args[0])
        q_out = ctx.q_of(node)
        if q_out is None:
            return fp(ctx, x, node)
        base = ctx.g.before_reshapes(x.name)
        info = ctx.g.info[base]
        if base == x.name or x.q.dtype != torch.int8 or info.shape[0] != 1:
            return ctx.table(x, _same_function(node), q_out, node=node)
        # The TABLE goes before the RESHAPEs (elementwise, so the same values), next to the op that computes its
        # input: Vela runs it as that op's activation, not as an operation of its own (PVT's GELU after its
        # depthwise convolution, flattened to tokens). Not after a batch of rows (a linear layer's [tokens, 1, 1,
        # C] convolution): Vela fuses it there only past the RESHAPE back to the feature map (ConvNeXt's GELU).
        # The RESHAPEs left unread are pruned.
        table = ctx.table(Value(base, info.shape, info.dtype, tuple(range(len(info.shape))), x.q),
                          _same_function(node), q_out, node=node)
        return ctx.relayout(table, x.shape, x.order, node)

    return rule


def unary(op):
    """Rule for a function with its own TOSA op: the op in float, a TABLE in int8."""
    return activation(lambda ctx, x, node: ctx.emit(op, [x], x.shape, x.dtype, like=x, node=node))


def _float_inputs(node: Node, spec) -> str | None:
    """Refuses integer tensors that are not quantized values (those carry their qparams)."""
    vals = [a.meta.get("val") for a in node.all_input_nodes if a.meta.get("tosakit_q") is None]
    if any(isinstance(v, torch.Tensor) and not v.dtype.is_floating_point for v in vals):
        return f"{node.target} on integer tensors has no lowering; cast them to float first"
    return None


# ------------------------------------------------------------------ arithmetic


def _out_shape(a: Value, b: Value) -> tuple[int, ...]:
    return tuple(max(x, y) for x, y in zip(a.shape, b.shape))


def _alpha_check(node: Node, spec) -> str | None:
    alpha = node.kwargs.get("alpha", 1)
    return None if alpha == 1 else f"{node.target} with alpha={alpha} has no lowering yet"


def _operands(ctx: Lowering, node: Node) -> tuple[Value, Value]:
    """The two operands of a binary op; a number (on either side) becomes a constant."""
    a, b = node.args[:2]
    like = ctx.arg(a if isinstance(a, Node) else b)
    a, b = (ctx.arg(x) if isinstance(x, Node) else ctx.scalar(float(x), like) for x in (a, b))
    return tuple(broadcast(ctx, a, b))


def _exact_coarser(out_scale: float, coarse_scale: float, k: int) -> bool:
    """Whether the output RESCALE of an ADD/SUB whose operands came in as integers times 2**(j + k) (scale
    ``out_scale``) can take them times 2**j instead (``coarse_scale``) with every result the same: it can when
    its multiplier stays and its shift drops by k.

    The input RESCALEs multiply by a power of two exactly (multiplier 2**30, no rounding), so the int32 sum is
    v * 2**(j + k) before and v * 2**j after, for the same integer v. TOSA's apply_scale_32 on the output gives
    floor((v * 2**(j + k) * m + 2**(s - 1)) / 2**s) before and floor((v * 2**j * m + 2**(s - k - 1)) / 2**(s - k))
    after: the same real number, so the same integer (and the same range REQUIRE, scaled alike). This holds
    when the multiplier (m, s) was not cut for a shift above 62 and s - k is still a legal shift (>= 2)."""
    if k <= 0:
        return False
    try:
        multiplier, shift = quantize_multiplier(out_scale)
        coarser = quantize_multiplier(coarse_scale)
    except ValueError:
        return False
    return shift <= 62 and coarser == (multiplier, shift - k)


def _add_sub(ctx: Lowering, node: Node, op) -> Value:
    a, b = _operands(ctx, node)
    shape = _out_shape(a, b)
    q_out = ctx.q_of(node)
    if q_out is None:
        return ctx.fused_clamp(binary(ctx, op, [a, b], shape, a.dtype, node=node), node)
    # both operands to int32 on a shared fine scale, add, then one rescale to the output
    headroom = ADD_SHIFT if DType.INT16 not in (a.dtype, b.dtype) else ADD_SHIFT_INT16
    common = 2 * max(a.q.s, b.q.s) / (1 << headroom)
    coarse = a.q.s / (1 << EQUAL_SCALE_SHIFT)
    if a.q.s == b.q.s and _exact_coarser(common / q_out.s, coarse / q_out.s, headroom - 1 - EQUAL_SCALE_SHIFT):
        common = coarse
    a32 = ctx.rescale(a, a.q.s / common, DType.INT32, a.q.zp, 0)
    b32 = ctx.rescale(b, b.q.s / common, DType.INT32, b.q.zp, 0)
    acc = binary(ctx, op, [a32, b32], shape, DType.INT32, node=node)
    out = ctx.rescale(acc, common / q_out.s, int_dtype(q_out), 0, q_out.zp, q=q_out, node=node)
    return ctx.fused_clamp(out, node)


@lowers(aten.add.Tensor, int16=True, check=_alpha_check)
def add(ctx: Lowering, node: Node) -> Value:
    return _add_sub(ctx, node, Op.ADD)


@lowers(aten.sub.Tensor, int16=True, check=_alpha_check)
def sub(ctx: Lowering, node: Node) -> Value:
    return _add_sub(ctx, node, Op.SUB)


@lowers(aten.mul.Tensor, int16=True)
def mul(ctx: Lowering, node: Node) -> Value:
    a, b = _operands(ctx, node)
    shape = _out_shape(a, b)
    q_out = ctx.q_of(node)
    if q_out is None:
        return binary(ctx, Op.MUL, [a, b], shape, a.dtype, node=node)
    a32 = ctx.rescale(a, 1.0, DType.INT32, a.q.zp, 0)
    b32 = ctx.rescale(b, 1.0, DType.INT32, b.q.zp, 0)
    acc = binary(ctx, Op.MUL, [a32, b32], shape, DType.INT32, node=node)
    return ctx.rescale(acc, a.q.s * b.q.s / q_out.s, int_dtype(q_out), 0, q_out.zp, q=q_out, node=node)


def _div_check(node: Node, spec) -> str | None:
    if len(node.args) > 1 and not isinstance(node.args[1], Node) and float(node.args[1]) == 0:
        return "division by the constant 0 has no lowering"
    return _float_inputs(node, spec)


@lowers(aten.div.Tensor, int=False, check=_div_check)
def div(ctx: Lowering, node: Node) -> Value:
    """a / b = a * RECIPROCAL(b) (the quantizer rewrites quantized divisions into those two ops)."""
    a, b = node.args[:2]
    inverse = ew(ctx, Op.RECIPROCAL, ctx.arg(b), node=node) if isinstance(b, Node) else 1.0 / float(b)
    return ew(ctx, Op.MUL, ctx.arg(a), inverse, node=node)


@lowers(aten.neg.default, int16=True)
def neg(ctx: Lowering, node: Node) -> Value:
    """NEGATE, zero points included; int8 with another output scale is a TABLE. int16 (zero point 0) negates
    exactly on the input's scale, and the lowering rescales that to the output's."""
    x = ctx.arg(node.args[0])
    q_out = ctx.q_of(node)
    if q_out is not None and x.dtype == DType.INT16:
        q_out = x.q
    elif q_out is not None and q_out.s != x.q.s:
        return ctx.table(x, torch.neg, q_out, node=node)
    zps = (x.q.zp, q_out.zp) if q_out is not None else (0, 0)
    zp_consts = [ctx.g.zero_point(zp, x.dtype) for zp in zps]
    return ctx.emit(Op.NEGATE, [x, *zp_consts], x.shape, x.dtype, like=x, q=q_out, node=node)


def _extremum(op):
    """MAXIMUM/MINIMUM; quantized operands meet as int32 in output steps (rounding is monotonic, so
    picking first and adding the zero point after gives PyTorch's quantized result)."""

    def rule(ctx: Lowering, node: Node) -> Value:
        a, b = (ctx.arg(x) for x in node.args[:2])
        q_out = ctx.q_of(node)
        if q_out is None:
            return ew(ctx, op, a, b, node=node)
        a32, b32 = (ctx.rescale(v, v.q.s / q_out.s, DType.INT32, v.q.zp, 0) for v in (a, b))
        return ctx.rescale(ew(ctx, op, a32, b32, node=node), 1.0, int_dtype(q_out), 0, q_out.zp, q=q_out)

    return rule


lowers(aten.maximum.default)(_extremum(Op.MAXIMUM))
lowers(aten.minimum.default)(_extremum(Op.MINIMUM))


def _power(ctx: Lowering, x: Value, n: int, node: Node) -> Value:
    """x**n for an integer n >= 1, by repeated squaring."""
    result, base = None, x
    while n:
        if n & 1:
            result = base if result is None else ew(ctx, Op.MUL, result, base, node=node)
        n >>= 1
        if n:
            base = ew(ctx, Op.MUL, base, base, node=node)
    return result


def _pow(ctx: Lowering, x: Value, node: Node) -> Value:
    """Integer exponents multiply (valid for negative x too), others use POW."""
    e = node.args[1]
    if not float(e).is_integer():
        return ew(ctx, Op.POW, x, float(e), node=node)
    if e == 0:
        return ctx.const_value(torch.ones(x.torch_shape, dtype=node.meta["val"].dtype))
    p = _power(ctx, x, abs(int(e)), node)
    return p if e > 0 else ew(ctx, Op.RECIPROCAL, p, node=node)


_pow_or_table = activation(_pow)


def _pow_check(node: Node, spec) -> str | None:
    if integer_dtype(node) == torch.int16 and node.args[1] != 2:
        return f"{node.target} with exponent {node.args[1]} has no int16 (a16w8) lowering (only x ** 2 has)"
    return _float_inputs(node, spec)


@lowers(aten.pow.Tensor_Scalar, int16=True, check=_pow_check)
def pow_(ctx: Lowering, node: Node) -> Value:
    """int16 x ** 2: MUL int16 x int16 -> int32, then one RESCALE; other quantized powers are int8 TABLEs."""
    x = ctx.arg(node.args[0])
    q_out = ctx.q_of(node)
    if q_out is None or x.dtype != DType.INT16:
        return _pow_or_table(ctx, node)
    shift = ctx.g.const(np.zeros(1, np.int8), DType.INT8)
    acc = ctx.emit(Op.MUL, [x, x, shift], x.shape, DType.INT32, like=x, node=node)
    return ctx.rescale(acc, x.q.s * x.q.s / q_out.s, int_dtype(q_out), 0, q_out.zp, q=q_out, node=node)


# ------------------------------------------------------------------ functions of one input

# Functions of one input with an int16 TABLE (``Lowering.table16``) too: the ones a Llama decoder computes, and tanh.
INT16_TABLES = {aten.exp.default, aten.sigmoid.default, aten.silu.default, aten.rsqrt.default,
                aten.reciprocal.default, aten.tanh.default}

for _target, _op in {
    aten.sigmoid.default: Op.SIGMOID,
    aten.tanh.default: Op.TANH,
    aten.exp.default: Op.EXP,
    aten.log.default: Op.LOG,
    aten.rsqrt.default: Op.RSQRT,
    aten.reciprocal.default: Op.RECIPROCAL,
    aten.erf.default: Op.ERF,
    aten.abs.default: Op.ABS,
    aten.sin.default: Op.SIN,  # rotary position embeddings computed from the position at run time
    aten.cos.default: Op.COS,
}.items():
    lowers(_target, int16=_target in INT16_TABLES)(unary(_op))


@lowers(aten.sqrt.default)
@activation
def sqrt(ctx: Lowering, x: Value, node: Node) -> Value:
    """TOSA has no SQRT: POW(x, 0.5)."""
    return ew(ctx, Op.POW, x, 0.5, node=node)


@lowers(aten.gelu.default)
@activation
def gelu(ctx: Lowering, x: Value, node: Node) -> Value:
    """x/2 * (1 + erf(x/sqrt(2))), or with approximate='tanh' x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    if arg(node, 1, "approximate", "none") == "tanh":
        cube = ew(ctx, Op.MUL, ew(ctx, Op.MUL, x, x, node=node), x, node=node)
        inner = ew(ctx, Op.ADD, x, ew(ctx, Op.MUL, cube, 0.044715, node=node), node=node)
        t = ew(ctx, Op.TANH, ew(ctx, Op.MUL, inner, math.sqrt(2 / math.pi), node=node), node=node)
    else:
        t = ew(ctx, Op.ERF, ew(ctx, Op.MUL, x, math.sqrt(0.5), node=node), node=node)
    return ew(ctx, Op.MUL, ew(ctx, Op.MUL, x, 0.5, node=node), ew(ctx, Op.ADD, t, 1.0, node=node), node=node)


@lowers(aten.silu.default, int16=True)
@activation
def silu(ctx: Lowering, x: Value, node: Node) -> Value:
    """x * sigmoid(x)."""
    return ew(ctx, Op.MUL, x, ew(ctx, Op.SIGMOID, x, node=node), node=node)


@lowers(aten.hardswish.default)
@activation
def hardswish(ctx: Lowering, x: Value, node: Node) -> Value:
    """x * clamp(x + 3, 0, 6) / 6."""
    gate = ctx.clamp(ew(ctx, Op.ADD, x, 3.0, node=node), 0.0, 6.0, node=node)
    return scaled(ctx, ew(ctx, Op.MUL, x, gate, node=node), 1 / 6, node=node)


@lowers(aten.hardsigmoid.default)
@activation
def hardsigmoid(ctx: Lowering, x: Value, node: Node) -> Value:
    """clamp(x / 6 + 1/2, 0, 1)."""
    return ctx.clamp(ew(ctx, Op.ADD, scaled(ctx, x, 1 / 6, node=node), 0.5, node=node), 0.0, 1.0, node=node)


@lowers(aten.leaky_relu.default)
@activation
def leaky_relu(ctx: Lowering, x: Value, node: Node) -> Value:
    """max(x, a*x) for slopes in [0, 1]; otherwise max(x, 0) + a * min(x, 0)."""
    slope = float(arg(node, 1, "negative_slope", 0.01))
    if 0 <= slope <= 1:
        return ew(ctx, Op.MAXIMUM, x, scaled(ctx, x, slope, node=node), node=node)
    below = scaled(ctx, ctx.clamp(x, -F32_MAX, 0.0, node=node), slope, node=node)
    return ew(ctx, Op.ADD, ctx.clamp(x, 0.0, F32_MAX, node=node), below, node=node)


@lowers(aten.elu.default)
@activation
def elu(ctx: Lowering, x: Value, node: Node) -> Value:
    """scale * (max(x, 0) + alpha * (exp(input_scale * min(x, 0)) - 1))."""
    alpha, scale, input_scale = (float(arg(node, i, n, 1.0)) for i, n in
                                 ((1, "alpha"), (2, "scale"), (3, "input_scale")))
    below = ew(ctx, Op.EXP, scaled(ctx, ctx.clamp(x, -F32_MAX, 0.0, node=node), input_scale, node=node), node=node)
    below = scaled(ctx, ew(ctx, Op.SUB, below, 1.0, node=node), alpha, node=node)
    return scaled(ctx, ew(ctx, Op.ADD, ctx.clamp(x, 0.0, F32_MAX, node=node), below, node=node), scale, node=node)


# ------------------------------------------------------------------ clamps


def _clamp_rule(ctx: Lowering, node: Node, lo: float | None, hi: float | None) -> Value:
    x = ctx.arg(node.args[0])
    q_out = ctx.q_of(node)
    if q_out is None:
        return ctx.clamp(x, -F32_MAX if lo is None else lo, F32_MAX if hi is None else hi, node=node)
    if (x.q.s, x.q.zp) != (q_out.s, q_out.zp):
        x = ctx.rescale(x, x.q.s / q_out.s, int_dtype(q_out), x.q.zp, q_out.zp, q=q_out)
    return ctx.clamp(x.with_(q=q_out), *quantized_bounds(q_out, lo, hi), node=node)


@lowers(aten.relu.default, int16=True)
def relu(ctx: Lowering, node: Node) -> Value:
    return _clamp_rule(ctx, node, 0.0, None)


@lowers(aten.hardtanh.default, int16=True)
def hardtanh(ctx: Lowering, node: Node) -> Value:
    lo = node.args[1] if len(node.args) > 1 else -1.0
    hi = node.args[2] if len(node.args) > 2 else 1.0
    return _clamp_rule(ctx, node, float(lo), float(hi))


@lowers(aten.clamp.default, int16=True)
def clamp(ctx: Lowering, node: Node) -> Value:
    lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    return _clamp_rule(ctx, node, None if lo is None else float(lo), None if hi is None else float(hi))


# ------------------------------------------------------------------ constants and casts


FILL_ARG = {aten.full.default: 1, aten.full_like.default: 1, aten.scalar_tensor.default: 0}  # where the value is


def _dtypes_check(node: Node, spec) -> str | None:
    vals = [a.meta.get("val") for a in node.all_input_nodes] + [node.meta.get("val")]
    bad = [v.dtype for v in vals if isinstance(v, torch.Tensor) and v.dtype not in TORCH_TO_TOSA]
    return f"{node.target} on {bad[0]} tensors: TOSA has no {bad[0]} type" if bad else None


@lowers(*FILL_ARG, check=_dtypes_check)
def full(ctx: Lowering, node: Node) -> Value:
    """A constant tensor (full, zeros, ones and their *_like forms all decompose to these)."""
    val = node.meta["val"]
    return ctx.const_value(torch.full(tuple(val.shape), node.args[FILL_ARG[node.target]], dtype=val.dtype))


def _cast_check(node: Node, spec) -> str | None:
    src, dst = node.args[0].meta["val"].dtype, node.meta["val"].dtype
    if spec.is_u55_subset and torch.bool in (src, dst) and src != dst:
        return f"casting {src} to {dst} needs SELECT/EQUAL, outside the Ethos-U55/U65 TOSA subset"
    if node.args[0].target in INDEX_RESULT_OPS and dst in TORCH_TO_TOSA:
        return None  # arg-max indices are int32 inside the delegate
    return _dtypes_check(node, spec)


def _trunc(ctx: Lowering, x: Value, node: Node) -> Value:
    """Round toward zero, as PyTorch's float-to-integer conversion does (CAST rounds to nearest)."""
    up = ew(ctx, Op.GREATER_EQUAL, x, 0.0, node=node)
    return ew(ctx, Op.SELECT, up, ew(ctx, Op.FLOOR, x, node=node), ew(ctx, Op.CEIL, x, node=node), node=node)


@lowers(aten._to_copy.default, check=_cast_check)
def to_copy(ctx: Lowering, node: Node) -> Value:
    """dtype casts: CAST, with PyTorch's truncation for float -> int and bool handled by compare/select."""
    x = ctx.arg(node.args[0])
    dst = TORCH_TO_TOSA[node.meta["val"].dtype]
    if dst == DType.BOOL and x.dtype != DType.BOOL:  # x != 0 (quantized: x != zero point)
        zero = float(x.q.zp) if x.q is not None else 0.0
        return ew(ctx, Op.LOGICAL_NOT, ew(ctx, Op.EQUAL, x, zero, node=node), node=node)
    if x.q is not None or x.dtype == dst:  # a copy (quantized: the same integers, requantized after)
        return x
    if x.dtype == DType.BOOL and is_float(dst):  # SELECT between 1 and 0 (quantized when the result is)
        q_out = ctx.q_of(node)
        levels = q_out.quantize(torch.tensor([1.0, 0.0])).tolist() if q_out else [1.0, 0.0]
        like = x.with_(dtype=int_dtype(q_out) if q_out else dst)
        one, zero = (ctx.scalar(v, like) for v in levels)
        return ew(ctx, Op.SELECT, x, one, zero, q=q_out, node=node)
    if is_float(x.dtype) and not is_float(dst):
        x = _trunc(ctx, x, node)
    return ctx.emit(Op.CAST, [x], x.shape, dst, like=x, node=node)
