"""Data movement and reductions beyond their table (support/op_tables/shape.py, run by test_ops.py): arg-max's
int32 indices, and refusals with their reasons."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from support.op_cases import OpCase, seed_inputs
from support.op_tables.shape import POSITIONS, TABLE, Op

pytestmark = pytest.mark.numerics

F = nn.functional


# ------------------------------------------------------------------ arg-max: int32 in TOSA, int64 in PyTorch


ARGMAX_CASES = {
    "argmax": (lambda x: x.argmax(1), [(2, 5, 3)], False),
    "argmax_all": (lambda x: x.argmax(), [(2, 3, 4)], False),
    "conv_argmax_channels_keepdim": (lambda x: x.argmax(1, keepdim=True), [(1, 3, 4, 5)], True),
    "conv_argmax_w_batch2": (lambda x: x.argmax(-1), [(2, 3, 4, 5)], True),
}
ARGMAX_TARGETS = {"fp": "TOSA-1.0+FP+INT", "int": "TOSA-1.0+INT", "u55": "ethos-u55-128", "u85": "ethos-u85-256"}


@pytest.mark.parametrize("flavour", list(ARGMAX_TARGETS))
@pytest.mark.parametrize("name", list(ARGMAX_CASES))
@pytest.mark.parametrize("cast", [False, True], ids=["int64", "to_int32"])
def test_argmax(harness, name, flavour, cast):
    """ARGMAX in the delegate gives int32 indices (TOSA has no int64); PyTorch's int64 result is a widening
    cast on the CPU after the delegate, and a `.to(int32)` in the model is free. Indices equal PyTorch's
    (the fake-quantized model's when quantized): the int8 order is the real order."""
    from tosakit.runtime import run_edge

    fn, shapes, conv = ARGMAX_CASES[name]
    module = Op((lambda x: fn(x).to(torch.int32)) if cast else fn, conv).eval()
    inputs = seed_inputs(*shapes)
    quantize = flavour != "fp"
    compiled = harness.compile(module, inputs, ARGMAX_TARGETS[flavour], quantize=quantize)
    harness.assert_delegated(compiled)
    assert all("ARGMAX" in d.tosa_ops for d in compiled.edge.delegates)
    assert ("aten::_to_copy.out" in compiled.program.emitted.kernel_ops) != cast
    [got] = run_edge(compiled.edge, *inputs)
    want = (compiled.quantized if quantize else module)(*inputs)
    assert got.dtype == want.dtype == (torch.int32 if cast else torch.int64) and torch.equal(got, want)
    if flavour in ("u55", "u85"):
        assert all(d.report.cpu_ops == 0 for d in compiled.edge.delegates)


def test_argmax_over_128_channels_refused_on_u55(harness):
    """Vela's arg-max takes at most 127 channels on Ethos-U55/U65: the reason says so."""
    module, inputs = Op(lambda x: x.argmax(1)).eval(), seed_inputs((1, 200))
    [left] = harness.cpu_compute(harness.compile(module, inputs, "ethos-u55-128", quantize=True))
    assert left.target == "aten.argmax.default" and "at most 127 values" in left.reason


# ------------------------------------------------------------------ refusals, each with its reason


class IndexByInput(nn.Module):
    def forward(self, x, index):
        return x.index_select(1, index)


def test_gather_refused_on_u55_with_reason(harness):
    module, inputs = TABLE.build("gather")
    [left] = harness.cpu_compute(harness.compile(module, inputs, "ethos-u55-128", quantize=True))
    assert left.target == "aten.gather.default" and "GATHER" in left.reason and "Ethos-U55" in left.reason


def test_index_select_with_run_time_int64_indices_delegates_fp():
    """int64 indices given at run time are cast to int32 at the delegate's edge (no compute op on the CPU); the
    index_select runs in the delegate and the program gives the model's result."""
    from tosakit.flow import compile
    from tosakit.runtime import LoadedProgram

    inputs = (seed_inputs((2, 3, 5))[0], torch.tensor([2, 0]))
    compiled = compile(IndexByInput(), inputs, "TOSA-1.0+FP")
    [cast] = [p for p in compiled.edge.placements if p.placement == "cpu"]
    assert "int64" in cast.reason and not cast.compute
    got = LoadedProgram(compiled.program.buffer, "index.pte", isolate=False).run(list(inputs))[0]
    assert torch.equal(got, IndexByInput()(*inputs))


@pytest.mark.parametrize("name,op", [("index_rows", "GATHER"), ("index_put_rows", "SCATTER")])
def test_run_time_indexing_refused_on_u55_with_reason(harness, name, op):
    """Ethos-U55/U65 have neither GATHER nor SCATTER: the indexing stays on the CPU, the reason says why."""
    module, inputs = TABLE.build(name)
    left = harness.cpu_compute(harness.compile(module, inputs, "ethos-u55-128", quantize=True))
    assert [p for p in left if op in p.reason and "Ethos-U55/U65" in p.reason], left


def test_index_put_accumulate_refused_with_reason(harness):
    """A scatter-add has no TOSA op (SCATTER writes each row once)."""
    module, inputs = OpCase(lambda: Op(lambda c, pos, v: c.index_put((pos,), v, accumulate=True)),
                            [(16, 4), POSITIONS, (2, 4)]).build()
    compiled = harness.compile(module, inputs, "TOSA-1.0+FP", quantize=False)
    [left] = harness.cpu_compute(compiled)
    assert left.target == "aten.index_put.default" and "accumulate" in left.reason


def test_integer_cumsum_to_int64_runs_in_int32_u85(harness):
    """Integers sum to int64 in PyTorch, which TOSA lacks: the cumulative sum runs in int32 in the delegate and
    its result is cast back to the int64 the model gives, at the edge; the program gives the model's result. The
    positions multiply the triangle broadcast, not TILEd (hf:tiny/roberta's position ids on ethos-u85-256: 1.08x
    of ExecuTorch's cycles with the TILE, 0.84x without)."""
    from tosakit.runtime import LoadedProgram

    module, inputs = Op(lambda x: (x > 0).to(torch.int32).cumsum(-1)).eval(), seed_inputs((2, 8))
    compiled = harness.compile(module, inputs, "ethos-u85-256", quantize=True)
    assert not harness.cpu_compute(compiled)
    assert "TILE" not in compiled.edge.delegates[0].tosa_ops
    got = LoadedProgram(compiled.program.buffer, "cumsum.pte", isolate=False).run(list(inputs))[0]
    assert got.dtype == torch.int64 and torch.equal(got, module(*inputs))


def test_negative_padding_refused_with_reason(harness):
    module, inputs = Op(lambda x: F.pad(x, (-1, 1))).eval(), seed_inputs((2, 3, 5))
    [left] = harness.cpu_compute(harness.compile(module, inputs, "TOSA-1.0+FP", quantize=False))
    assert left.target == "aten.constant_pad_nd.default" and "negative padding" in left.reason


def test_rank_above_six_refused_with_reason(harness):
    module, inputs = Op(lambda x: x.reshape(1, 1, 2, 1, 3, 1, 4) * 2).eval(), seed_inputs((2, 3, 4))
    compiled = harness.compile(module, inputs, "TOSA-1.0+FP", quantize=False)
    left = {p.target: p.reason for p in harness.cpu_compute(compiled)}
    assert "exceeds TOSA's limit of 6" in left["aten.view.default"]
