"""Elementwise ops, activations, comparisons, logic, constants and casts. Comparisons, logic and selection are
outside the U55 subset: there the partitioner leaves them on the CPU and says why."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from support.op_cases import ALL, Fn, OpCase, OpTable

NOT_U55 = ("fp", "int", "u85")  # needs EQUAL/GREATER/SELECT/LOGICAL_*: U55 refusal tested instead


ANCHORS = torch.tensor([[10, 13], [16, 30], [33, 23]]).view(1, 3, 1, 2)  # YOLO's, an int tensor


def _case(fn, shapes=((1, 4, 5, 5),), flavours=ALL, positive=False) -> OpCase:
    return OpCase(lambda: Fn(fn), shapes, flavours, positive)


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

TABLE = OpTable("ops_elementwise", CASES)
