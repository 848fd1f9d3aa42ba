"""Elementwise ops, activations, comparisons, logic, constants and casts, four ways: _fp (TOSA FP vs
PyTorch), _int (TOSA INT vs the fake-quantized model), _u55 and _u85 (quantized, compiled by Vela with
every op on the NPU). Comparisons, logic and selection are outside the U55 subset: there the test is
that the partitioner leaves them on the CPU and says why."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from op_cases import Fn, OpTable

pytestmark = pytest.mark.numerics

ALL = ("fp", "int", "u55", "u85")
NOT_U55 = ("fp", "int", "u85")  # needs EQUAL/GREATER/SELECT/LOGICAL_*: U55 refusal tested instead


ANCHORS = torch.tensor([[10, 13], [16, 30], [33, 23]]).view(1, 3, 1, 2)  # YOLO's, an int tensor


def _case(fn, shapes=((1, 4, 5, 5),), flavours=ALL, positive=False):
    return fn, shapes, flavours, positive


CASES = {
    # arithmetic
    "div": _case(lambda x, y: x / y, ((1, 4, 5, 5), (1, 4, 5, 5)), positive=True),
    "div_scalar": _case(lambda x: x / 4.0),
    "rsub": _case(lambda x: 1 - x),
    "neg": _case(lambda x: -x),
    "abs": _case(torch.abs),
    "maximum": _case(torch.maximum, ((1, 4, 5, 5), (1, 4, 5, 5))),
    "minimum_broadcast": _case(torch.minimum, ((2, 8), (1, 8))),
    "pow_2": _case(lambda x: x ** 2),
    "pow_3": _case(lambda x: x.pow(3)),
    "pow_neg1": _case(lambda x: x ** -1, positive=True),
    "pow_half": _case(lambda x: x ** 0.5, positive=True),
    # functions of one input
    "exp": _case(torch.exp),
    "log": _case(torch.log, positive=True),
    "sin": _case(lambda x: torch.sin(3 * x)),
    "cos": _case(lambda x: torch.cos(3 * x)),
    "sqrt": _case(torch.sqrt, positive=True),
    "rsqrt": _case(torch.rsqrt, positive=True),
    "reciprocal": _case(torch.reciprocal, positive=True),
    "tanh": _case(torch.tanh),
    "gelu": _case(F.gelu),
    "gelu_tanh": _case(lambda x: F.gelu(x, approximate="tanh")),
    "silu": _case(nn.SiLU(inplace=True)),
    "hardswish": _case(nn.Hardswish()),
    "hardsigmoid": _case(nn.Hardsigmoid()),
    "leaky_relu": _case(nn.LeakyReLU(0.1)),
    "leaky_relu_steep": _case(lambda x: F.leaky_relu(x, 1.5)),
    "elu": _case(nn.ELU(0.5)),
    "selu": _case(nn.SELU()),
    # constants and copies
    "full": _case(lambda x: x + torch.full((1, 4, 1, 1), 0.5)),
    "ones_like": _case(lambda x: x * torch.ones_like(x) + torch.zeros(5)),
    "clone": _case(lambda x: torch.sigmoid(x).clone()),
    "mul_int_constant": _case(lambda x: x * ANCHORS, ((1, 3, 4, 2),)),  # int64 anchors, promoted as PyTorch does
    # comparisons, logic, selection (bool results feed a select, as models use them)
    "gt_where": _case(lambda x, y: torch.where(x > y, x, y), ((1, 4, 5, 5), (1, 4, 5, 5)), NOT_U55),
    "lt_where": _case(lambda x, y: torch.where(x < y, x, y), ((2, 8), (2, 8)), NOT_U55),
    "ge_scalar": _case(lambda x, y: torch.where(x >= 0.25, x, y), ((2, 8), (2, 8)), NOT_U55),
    "le_scalar": _case(lambda x, y: torch.where(x <= -0.1, y, x), ((2, 8), (2, 8)), NOT_U55),
    "eq_scalar": _case(lambda x, y: torch.where(torch.relu(x) == 0, y, x), ((2, 8), (2, 8)), NOT_U55),
    "ne_tensor": _case(lambda x, y: torch.where(x != x.clamp(-0.5, 0.5), y, x), ((2, 8), (2, 8)), NOT_U55),
    "where_number": _case(lambda x: torch.where(x > 0.3, x, 0.0), ((2, 8),), NOT_U55),
    "masked_fill": _case(lambda x: x.masked_fill(x < -0.5, 1.0), ((2, 8),), NOT_U55),
    "logical_and": _case(lambda x, y: torch.where((x > 0) & (y < 0.5), x, y), ((2, 8), (2, 8)), NOT_U55),
    "logical_or": _case(lambda x, y: torch.where(torch.logical_or(x > 1, y > 1), x, y), ((2, 8), (2, 8)), NOT_U55),
    "logical_not": _case(lambda x, y: torch.where(torch.logical_not(x <= y), x, y), ((2, 8), (2, 8)), NOT_U55),
    "any_dim": _case(lambda x, y: torch.where((x > 1).any(dim=-1, keepdim=True), y, x), ((4, 8), (4, 8)), NOT_U55),
    "all_dims": _case(lambda x, y: torch.where((x > -1.5).all(dim=(1, 2)), y, x), ((1, 4, 5, 5), (1, 4, 5, 5)),
                      NOT_U55),
    "bitwise_on_masks": _case(lambda x, y: torch.where(~(x > 0) ^ (y > 0) | (x > y), x, y), ((2, 8), (2, 8)),
                              NOT_U55),
    # casts
    "bool_to_float": _case(lambda x, y: x * (x > y).float(), ((2, 8), (2, 8)), NOT_U55),
    "float_to_int": _case(lambda x: (x * 4).to(torch.int32).to(torch.float32), flavours=("fp",)),
}


def _params(flavour):
    return [pytest.param(name, id=f"{name}_{flavour}") for name, (_, _, flavours, _) in CASES.items()
            if flavour in flavours]


def _inputs(shapes, positive):
    g = torch.Generator().manual_seed(0)
    if positive:
        return tuple(torch.rand(*s, generator=g) * 2 + 0.25 for s in shapes)
    return tuple(torch.randn(*s, generator=g) for s in shapes)


def _model(name):
    fn, shapes, _, positive = CASES[name]
    return Fn(fn).eval(), _inputs(shapes, positive)


OP_TABLE = OpTable({name: case[2] for name, case in CASES.items()}, _model)


@pytest.mark.parametrize("name", _params("fp"))
def test_elementwise_op_fp(harness, name):
    module, inputs = _model(name)
    harness.fp(module, inputs)


@pytest.mark.parametrize("name", _params("int"))
def test_elementwise_op_int(harness, name):
    module, inputs = _model(name)
    harness.int(module, inputs)


@pytest.mark.parametrize("name", _params("u55"))
def test_elementwise_op_u55(harness, name):
    module, inputs = _model(name)
    harness.ethosu(module, inputs, "ethos-u55-128", case=name)


@pytest.mark.parametrize("name", _params("u85"))
def test_elementwise_op_u85(harness, name):
    module, inputs = _model(name)
    harness.ethosu(module, inputs, "ethos-u85-256")


def _partition(module, inputs, target, quantize):
    """The edge program for ``target``: partitioned and lowered, not emitted (so no CPU kernel is needed)."""
    from tosakit.capture import export
    from tosakit.flow import partitioner_for, quantize_model
    from tosakit.program import to_edge_transform_and_lower
    from tosakit.specs import compile_spec_for_target

    spec = compile_spec_for_target(target)
    model = quantize_model(module, inputs, spec) if quantize else module
    return to_edge_transform_and_lower(export(model, inputs), partitioner=[partitioner_for(spec)])


@pytest.mark.parametrize("name", [n for n, (_, _, flavours, _) in CASES.items() if "u85" in flavours
                                  and "u55" not in flavours])
def test_elementwise_op_u55_refused(name):
    """Comparisons, logic, selection and bool casts stay on the CPU for the U55, each with the reason."""
    module, inputs = _model(name)
    edge = _partition(module, inputs, "ethos-u55-128", quantize=True)
    left = [p for p in edge.placements if p.placement == "cpu" and "quantize" not in p.target]
    assert left, "nothing was left on the CPU"
    for p in left:
        assert "Ethos-U55/U65 TOSA subset" in p.reason, f"{p.node}: {p.reason}"


def test_silu_lowers_whole_as_one_table(harness):
    """silu is kept whole (not sigmoid * x), so the integer graph is a single TABLE."""
    module, inputs = _model("silu")
    compiled = harness.int(module, inputs)
    [delegate] = compiled.edge.delegates
    assert delegate.tosa_ops == {"TABLE": 1}


@pytest.mark.parametrize("op, c", [("ge", 0.25), ("gt", 0.25), ("ge", 0.2523), ("le", 0.2477), ("lt", 0.2523),
                                   ("eq", 0.25), ("eq", 0.2523)])
def test_quantized_comparison_with_number_is_exact(harness, op, c):
    """A quantized tensor compared with a number compares integers with a threshold in the tensor's own
    steps, rounded the way that keeps the answer exact. Here the steps are 1/128, so 0.25 is a level
    and 0.2523, 0.2477 fall between levels: the element 0.25 is picked exactly when PyTorch picks it."""
    from tosakit.runtime import run_edge

    x = (torch.arange(-128, 128, dtype=torch.float32) / 128).reshape(2, 128)
    compare = getattr(torch, op)
    compiled = harness.int(Fn(lambda x, y: torch.where(compare(x, c), x, y)), (x, -x))
    (got,) = run_edge(compiled.edge, x, -x)
    at = x == 0.25
    chosen = x[at] if compare(torch.tensor(0.25), c) else -x[at]
    assert torch.allclose(got[at], chosen, atol=0.01), (got[at], chosen)  # the other choice is 0.5 away


def test_division_by_zero_constant_stays_on_cpu(harness):
    compiled = harness.compile(Fn(lambda x: x / 0.0), _inputs([(2, 4)], False), "TOSA-1.0+FP", quantize=False)
    [placement] = harness.cpu_compute(compiled)
    assert "division by the constant 0" in placement.reason


def test_int64_cast_is_refused_with_reason():
    """TOSA has no int64: the partitioner leaves the cast of an int64 input out and says why; the add is
    delegated."""
    inputs = (torch.randn(2, 4), torch.arange(8).reshape(2, 4))
    edge = _partition(Fn(lambda x, i: x + i.float()), inputs, "TOSA-1.0+FP", quantize=False)
    placed = {p.node: p for p in edge.placements}
    assert placed["_to_copy"].placement == "cpu" and "TOSA has no int64" in placed["_to_copy"].reason
    assert placed["add"].placement == "delegate"
