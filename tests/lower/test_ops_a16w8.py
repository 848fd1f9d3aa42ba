"""Ops with 16-bit activations beyond their table (support/op_tables/a16w8.py, run by test_ops.py): the limits of
int16 lowerings refused with their reasons."""

from __future__ import annotations

import pytest

from support.op_cases import Fn, seed_inputs
from support.op_tables.a16w8 import a16w8_config

pytestmark = pytest.mark.numerics


@pytest.mark.parametrize("fn, why", [
    (lambda x: x.pow(3), "aten.pow.Tensor_Scalar with exponent 3 has no int16 (a16w8) lowering (only x ** 2 has)"),
    (lambda x: x.sum(), "aten.sum.dim_IntList adds 65540 int16 values, which can overflow its int32 accumulator"),
], ids=["pow_3", "sum_65540"])
def test_a16w8_limits_refused_with_reason_int(harness, fn, why):
    """An int16 power other than a square, or a sum of more int16 values than int32 always holds, stays on the
    CPU and says why."""
    compiled = harness.compile(Fn(fn).eval(), seed_inputs((4, 16385)), "TOSA-1.0+INT", quantize=True,
                               config=a16w8_config())
    [left] = harness.cpu_compute(compiled)
    assert left.reason.startswith(why), left.reason
