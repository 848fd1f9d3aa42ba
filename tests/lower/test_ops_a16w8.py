"""Ops with 16-bit activations (a16w8: ``get_symmetric_a16w8_quantization_config``), three ways: _int (the TOSA INT
graph on the reference model against the fake-quantized model evaluated exactly), _u55 and _u85 (compiled by Vela
with every op on the NPU, the command stream simulated bit for bit against the reference model on its TOSA). Where
Ethos-U55/U65 cannot run an op in int16, the _u55 test pins it on the CPU with its reason. Every case checks that
its delegates take int16 activations and hold the TOSA op the lowering stands for."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import assert_u85_bit_exact, ethosu_delegates
from op_cases import Fn, seed_inputs
from test_ops_layers import TokenEmbedding

pytestmark = pytest.mark.numerics


def _config():
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

# name -> (module factory, inputs (shapes of seeded floats, or tensors as they are), TOSA op, the U55's reason for
# keeping the op on the CPU (None: it runs on the U55 too))
CASES = {
    "neg": (lambda: Fn(torch.neg), [(1, 4, 5, 5)], "NEGATE", None),
    "neg_slice": (lambda: Fn(lambda x: -x[..., 4:]), [(1, 2, 6, 8)], "NEGATE", None),  # on a finer scale than x's
    "neg_rotate_half": (lambda: Fn(_rotate_half), [(1, 2, 6, 8)], "NEGATE", None),
    "pow_2": (lambda: Fn(lambda x: x.pow(2)), [(1, 4, 5, 5)], "MUL", None),
    "pow_2_rms": (lambda: Fn(lambda x: x * x.pow(2).mean(-1, keepdim=True)), [(2, 6, 16)], "MUL", None),
    "amax": (lambda: Fn(lambda x: x.amax((1, 2), keepdim=True)), [(2, 3, 4)], "REDUCE_MAX", None),
    "amax_last": (lambda: Fn(lambda x: x - x.amax(-1, keepdim=True)), [(2, 4, 16)], "REDUCE_MAX", None),
    "max_all": (lambda: Fn(lambda x: x.max()), [(2, 3, 4)], "REDUCE_MAX", None),
    "where": (lambda: Fn(lambda x, y, k, q: torch.where(k <= q, x, 3 * y)), [(2, 3, 8), (2, 3, 8), KEYS, QUERIES],
              "SELECT", NO_SELECT),
    "sum": (lambda: Fn(lambda x: x.sum(1)), [(2, 5, 3)], "REDUCE_SUM", None),
    "sum_last_keepdim": (lambda: Fn(lambda x: x.sum(-1, keepdim=True)), [(1, 4, 64)], "REDUCE_SUM", None),
    "sum_all": (lambda: Fn(lambda x: x.sum()), [(2, 3, 4)], "REDUCE_SUM", None),
    "bmm": (lambda: Fn(torch.bmm), [(2, 8, 16), (2, 16, 8)], "MATMUL", NO_MATMUL16),
    "matmul_2d": (lambda: Fn(torch.matmul), [(8, 16), (16, 4)], "MATMUL", NO_MATMUL16),
    "attention_scores": (lambda: Fn(lambda q, k: q @ k.transpose(-1, -2)), [(1, 2, 8, 16), (1, 2, 8, 16)], "MATMUL",
                         NO_MATMUL16),
    "embedding": (TokenEmbedding, [TOKENS], "GATHER", NO_GATHER),
}


def _case(name):
    factory, specs, _, _ = CASES[name]
    floats = iter(seed_inputs(*[s for s in specs if not isinstance(s, torch.Tensor)]))
    torch.manual_seed(0)
    return factory().eval(), tuple(s.clone() if isinstance(s, torch.Tensor) else next(floats) for s in specs)


def _params(flavour, u55=None):
    return [pytest.param(name, id=f"{name}_{flavour}") for name, case in CASES.items()
            if u55 is None or (case[3] is None) == u55]


def _assert_int16_op(compiled, name):
    """Every delegate's activations are int16 (no int8 tensor crosses its boundary), and one holds the case's TOSA
    op."""
    from tosakit.program import LoweredBackendModule
    from tosakit.runtime.tosa_check import check_tosa

    delegates = [m for m in compiled.edge.program.graph_module.children() if isinstance(m, LoweredBackendModule)]
    assert delegates
    for m in delegates:
        io = check_tosa(m.tosa, "delegate", 1 << 31)
        dtypes = {t.dtype for t in io.inputs + io.outputs}
        assert "INT16" in dtypes and dtypes <= {"INT16", "INT32", "BOOL"}, dtypes
    assert any(CASES[name][2] in d.tosa_ops for d in compiled.edge.delegates)


@pytest.mark.parametrize("name", _params("int"))
def test_a16w8_op_int(harness, name):
    module, inputs = _case(name)
    _assert_int16_op(harness.int(module, inputs, config=_config()), name)


@pytest.mark.parametrize("name", _params("u55", u55=True))
def test_a16w8_op_u55(harness, name):
    module, inputs = _case(name)
    _assert_int16_op(harness.ethosu(module, inputs, "ethos-u55-128", case=name, config=_config()), name)


@pytest.mark.parametrize("name", _params("u55", u55=False))
def test_a16w8_op_refused_u55(harness, name):
    """What Ethos-U55/U65 cannot run in int16 stays on the CPU, the reason naming the target's limit (not a missing
    int16 lowering)."""
    module, inputs = _case(name)
    compiled = harness.compile(module, inputs, "ethos-u55-128", quantize=True, config=_config())
    reasons = {p.reason for p in harness.cpu_compute(compiled)}
    assert CASES[name][3] in reasons and not any("no int16 (a16w8) lowering" in r for r in reasons), reasons


@pytest.mark.parametrize("name", _params("u85"))
def test_a16w8_op_u85(harness, name):
    module, inputs = _case(name)
    compiled = harness.ethosu(module, inputs, "ethos-u85-256", config=_config())
    _assert_int16_op(compiled, name)
    assert_u85_bit_exact(ethosu_delegates(compiled), seeds=(0, 1, 2))


@pytest.mark.parametrize("fn, why", [
    (lambda x: x.pow(3), "aten.pow.Tensor_Scalar with exponent 3 has no int16 (a16w8) lowering (only x ** 2 has)"),
    (lambda x: x.sum(), "aten.sum.dim_IntList adds 65540 int16 values, which can overflow its int32 accumulator"),
], ids=["pow_3", "sum_65540"])
def test_a16w8_limits_refused_with_reason_int(harness, fn, why):
    """An int16 power other than a square, or a sum of more int16 values than int32 always holds, stays on the
    CPU and says why."""
    compiled = harness.compile(Fn(fn).eval(), seed_inputs((4, 16385)), "TOSA-1.0+INT", quantize=True, config=_config())
    [left] = harness.cpu_compute(compiled)
    assert left.reason.startswith(why), left.reason
