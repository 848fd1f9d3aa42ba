"""Ops with 16-bit activations (a16w8: ``get_symmetric_a16w8_quantization_config``), _int, _u55 and _u85; where
Ethos-U55/U65 cannot run an op in int16, the reason it stays on the CPU."""

from __future__ import annotations

import torch

from support.op_cases import Fn, OpCase, OpTable
from support.op_tables.layers import TokenEmbedding


def a16w8_config():
    from tosakit.quantize import get_symmetric_a16w8_quantization_config

    return get_symmetric_a16w8_quantization_config()


def _rotate_half(x):
    """Llama's rotary helper."""
    return torch.cat((-x[..., 4:], x[..., :4]), dim=-1)


KEYS = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7], dtype=torch.int32)  # cache positions against query positions: a causal
QUERIES = torch.tensor([[2], [5], [7]], dtype=torch.int32)  # mask, as the decoder's attention compares them
TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]], dtype=torch.int32)
NO_MATMUL16 = ("MATMUL on Ethos-U55/U65: MATMUL runs on int8 x int8 only, not int16 x int16: quantize it with int8 "
               "activations")
NO_SELECT = "aten.where.self is outside the Ethos-U55/U65 TOSA subset"
NO_GATHER = "aten.embedding.default is outside the Ethos-U55/U65 TOSA subset: it needs TOSA GATHER"


def _case(factory, inputs, tosa_op: str, u55_reason: str | None = None) -> OpCase:
    """Runs _int and _u85, and _u55 unless Ethos-U55/U65 refuse it for ``u55_reason``; a delegate holds ``tosa_op``."""
    flavours = ("int", "u55", "u85") if u55_reason is None else ("int", "u85")
    return OpCase(factory, inputs, flavours, tosa_op=tosa_op, u55_reason=u55_reason)


CASES = {
    "neg": _case(lambda: Fn(torch.neg), [(1, 4, 5, 5)], "NEGATE"),
    "neg_slice": _case(lambda: Fn(lambda x: -x[..., 4:]), [(1, 2, 6, 8)], "NEGATE"),  # on a finer scale than x's
    "neg_rotate_half": _case(lambda: Fn(_rotate_half), [(1, 2, 6, 8)], "NEGATE"),
    "pow_2": _case(lambda: Fn(lambda x: x.pow(2)), [(1, 4, 5, 5)], "MUL"),
    "pow_2_rms": _case(lambda: Fn(lambda x: x * x.pow(2).mean(-1, keepdim=True)), [(2, 6, 16)], "MUL"),
    "amax": _case(lambda: Fn(lambda x: x.amax((1, 2), keepdim=True)), [(2, 3, 4)], "REDUCE_MAX"),
    "amax_last": _case(lambda: Fn(lambda x: x - x.amax(-1, keepdim=True)), [(2, 4, 16)], "REDUCE_MAX"),
    "max_all": _case(lambda: Fn(lambda x: x.max()), [(2, 3, 4)], "REDUCE_MAX"),
    "amin_last": _case(lambda: Fn(lambda x: x - x.amin(-1, keepdim=True)), [(2, 4, 16)], "REDUCE_MIN"),
    "where": _case(lambda: Fn(lambda x, y, k, q: torch.where(k <= q, x, 3 * y)), [(2, 3, 8), (2, 3, 8), KEYS, QUERIES],
                   "SELECT", NO_SELECT),
    "sum": _case(lambda: Fn(lambda x: x.sum(1)), [(2, 5, 3)], "REDUCE_SUM"),
    "sum_last_keepdim": _case(lambda: Fn(lambda x: x.sum(-1, keepdim=True)), [(1, 4, 64)], "REDUCE_SUM"),
    "sum_all": _case(lambda: Fn(lambda x: x.sum()), [(2, 3, 4)], "REDUCE_SUM"),
    "bmm": _case(lambda: Fn(torch.bmm), [(2, 8, 16), (2, 16, 8)], "MATMUL", NO_MATMUL16),
    "matmul_2d": _case(lambda: Fn(torch.matmul), [(8, 16), (16, 4)], "MATMUL", NO_MATMUL16),
    "attention_scores": _case(lambda: Fn(lambda q, k: q @ k.transpose(-1, -2)), [(1, 2, 8, 16), (1, 2, 8, 16)],
                              "MATMUL", NO_MATMUL16),
    "embedding": _case(TokenEmbedding, [TOKENS], "GATHER", NO_GATHER),
}

TABLE = OpTable("ops_a16w8", CASES, config=a16w8_config, u55_limit="Ethos-U55/U65", u85_seeds=(0, 1, 2))
