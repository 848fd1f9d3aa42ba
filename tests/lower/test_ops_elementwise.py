"""Elementwise ops beyond their table (support/op_tables/elementwise.py, run by test_ops.py): one TABLE for silu,
comparisons with numbers, refusals with their reasons."""

from __future__ import annotations

import pytest
import torch

from support.op_cases import Fn, seed_inputs
from support.op_tables.elementwise import TABLE

pytestmark = pytest.mark.numerics


def _partition(module, inputs, target, quantize):
    """The edge program for ``target``: partitioned and lowered, not emitted (so no CPU kernel is needed)."""
    from tosakit.capture import export
    from tosakit.flow import partitioner_for, quantize_model
    from tosakit.program import to_edge_transform_and_lower
    from tosakit.specs import compile_spec_for_target

    spec = compile_spec_for_target(target)
    model = quantize_model(module, inputs, spec) if quantize else module
    return to_edge_transform_and_lower(export(model, inputs), partitioner=[partitioner_for(spec)])


def test_silu_lowers_whole_as_one_table(harness):
    """silu is kept whole (not sigmoid * x), so the integer graph is a single TABLE."""
    module, inputs = TABLE.build("silu")
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
    compiled = harness.compile(Fn(lambda x: x / 0.0), seed_inputs((2, 4)), "TOSA-1.0+FP", quantize=False)
    [placement] = harness.cpu_compute(compiled)
    assert "division by the constant 0" in placement.reason


def test_int64_input_is_narrowed_at_the_edge_with_reason():
    """TOSA has no int64: an int64 input is cast to int32 on the CPU, at the delegate's edge (no compute op), and
    says why; its cast to float and the add are delegated."""
    inputs = (torch.randn(2, 4), torch.arange(8).reshape(2, 4))
    edge = _partition(Fn(lambda x, i: x + i.float()), inputs, "TOSA-1.0+FP", quantize=False)
    [edge_cast] = [p for p in edge.placements if p.placement == "cpu"]
    assert "TOSA has no int64" in edge_cast.reason and not edge_cast.compute
    placed = {p.node: p for p in edge.placements}
    assert placed["_to_copy"].placement == placed["add"].placement == "delegate"
