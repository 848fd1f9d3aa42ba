"""Data movement and reductions, four ways: _fp (TOSA FP vs PyTorch), _int (TOSA INT vs the fake-quantized
model), _u55 and _u85 (quantized, compiled by Vela with every op on the NPU). Cases named ``conv_*`` run
the op on a convolution's output, which sits in NHWC order inside the delegate."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from op_cases import OpTable, seed_inputs

pytestmark = pytest.mark.numerics

F = nn.functional


class Op(nn.Module):
    """``fn`` applied to the inputs (after a 1x1 convolution on the first one when ``conv``)."""

    def __init__(self, fn, conv: bool = False):
        super().__init__()
        self.fn = fn
        self.conv = nn.Conv2d(3, 6, 1) if conv else None

    def forward(self, x, *rest):
        return self.fn(self.conv(x) if self.conv is not None else x, *rest)


IDX = torch.tensor([2, 0, 1, 1])
GATHER_IDX = torch.tensor([[[0, 2, 1]], [[1, 1, 0]]])
POSITIONS = torch.tensor([5, 2], dtype=torch.int32)  # an input: positions known only at run time (a KV cache's)
ROWS = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))  # a table read at those positions (rotary)


def _write_rows(cache, pos, values, dim=2):
    """A KV cache written at run-time positions, as models write it (in place, on a copy)."""
    cache = cache.clone()
    cache[(slice(None),) * dim + (pos,)] = values
    return cache


# name -> (fn, input shapes, on a conv output, flavours)
ALL = ("fp", "int", "u55", "u85")
NO_GATHER = ("fp", "int", "u85")  # Ethos-U55/U65 have no GATHER (refusal tested below)
CASES = {
    # layout
    "transpose": (lambda x: x.transpose(1, 2), [(2, 3, 5)], False, ALL),
    "conv_transpose_hw": (lambda x: x.transpose(2, 3), [(1, 3, 4, 5)], True, ALL),
    "squeeze": (lambda x: x.squeeze(1), [(2, 1, 5)], False, ALL),
    "conv_squeeze_h": (lambda x: x[:, :, :1].squeeze(2), [(1, 3, 4, 5)], True, ALL),
    "unsqueeze": (lambda x: x.unsqueeze(-1), [(2, 3, 4)], False, ALL),
    "conv_unsqueeze": (lambda x: x.unsqueeze(1), [(1, 3, 4, 5)], True, ALL),
    # slicing
    "slice": (lambda x: x[:, 1:4], [(2, 6, 3)], False, ALL),
    "slice_step2_odd": (lambda x: x[:, ::2], [(2, 7, 3)], False, ALL),
    "conv_slice_channels_step2": (lambda x: x[:, 1::2, :, 1:], [(1, 3, 4, 5)], True, ALL),
    "select": (lambda x: x[:, -1], [(2, 3, 4)], False, ALL),
    "conv_select_channel": (lambda x: x[:, 2], [(1, 3, 4, 5)], True, ALL),
    "split": (lambda x: x.split([1, 3], 1)[1], [(2, 4, 3)], False, ALL),
    "chunk_both": (lambda x: torch.cat(x.chunk(2, -1)[::-1], -1), [(2, 3, 6)], False, ALL),
    "unbind": (lambda x: x.unbind(0)[1], [(2, 3, 4)], False, ALL),
    "index_select": (lambda x: x.index_select(1, IDX), [(2, 3, 5)], False, ALL),
    "conv_index_select": (lambda x: x.index_select(1, IDX), [(1, 3, 4, 5)], True, ALL),
    "gather": (lambda x: x.gather(1, GATHER_IDX), [(2, 3, 3)], False, NO_GATHER),
    # indices computed at run time (int32 inputs): GATHER and SCATTER rows
    "index_rows": (lambda x, pos: x + ROWS[pos], [(2, 8), POSITIONS], False, NO_GATHER),
    "index_select_at_positions": (lambda x, pos: x.index_select(1, pos), [(2, 16, 3), POSITIONS], False,
                                  NO_GATHER),
    "index_put_rows": (_write_rows, [(1, 2, 16, 8), POSITIONS, (1, 2, 2, 8)], False, NO_GATHER),
    "index_put_broadcast": (lambda c, pos, v: _write_rows(c, pos, v, dim=1), [(3, 16, 4), POSITIONS, (4,)], False,
                            NO_GATHER),
    # joining, repeating, padding, reversing
    "cat": (lambda x, y: torch.cat([x, y], 1), [(1, 2, 3, 4), (1, 3, 3, 4)], False, ALL),
    "cat_scaled": (lambda x, y: torch.cat([x, 4 * y], -1), [(2, 3, 4), (2, 3, 2)], False, ALL),
    "conv_cat_channels": (lambda x: torch.cat([x, -x[:, :2]], 1), [(1, 3, 4, 5)], True, ALL),
    "conv_cat_with_input": (lambda x, y: torch.cat([x, y], 1), [(1, 3, 4, 5), (1, 2, 4, 5)], True, ALL),
    "stack": (lambda x, y: torch.stack([x, y], 1), [(2, 3, 4), (2, 3, 4)], False, ALL),
    "expand": (lambda x: x.expand(2, 3, 4, 5), [(3, 1, 5)], False, ALL),
    "repeat": (lambda x: x.repeat(2, 1, 3), [(3, 4)], False, ALL),
    "conv_repeat": (lambda x: x.repeat(1, 1, 2, 1), [(1, 3, 4, 5)], True, ALL),
    "pad_constant": (lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), [(1, 3, 4, 5)], False, ALL),
    "conv_pad_channels": (lambda x: F.pad(x, (0, 0, 0, 0, 1, 1)), [(1, 3, 4, 5)], True, ALL),
    "pad_reflect": (lambda x: F.pad(x, (2, 1, 1, 0), mode="reflect"), [(1, 3, 4, 5)], False, ALL),
    "conv_pad_replicate": (lambda x: F.pad(x, (1, 1, 2, 0), mode="replicate"), [(1, 3, 4, 5)], True, ALL),
    "flip": (lambda x: x.flip(0, 2), [(2, 3, 4)], False, ALL),
    "conv_flip": (lambda x: x.flip(1, 3), [(1, 3, 4, 5)], True, ALL),
    # reductions
    "sum": (lambda x: x.sum(1), [(2, 5, 3)], False, ALL),
    "sum_all": (lambda x: x.sum(), [(2, 3, 4)], False, ALL),
    "conv_sum_channels_keepdim": (lambda x: x.sum(1, keepdim=True), [(1, 3, 4, 5)], True, ALL),
    "mean_channels": (lambda x: x.mean(1), [(1, 3, 4, 5)], True, ALL),
    "mean_all": (lambda x: x.mean(), [(2, 3, 4)], False, ALL),
    "amax": (lambda x: x.amax((1, 2), keepdim=True), [(2, 3, 4)], False, ALL),
    "conv_amin_channels": (lambda x: x.amin(1), [(1, 3, 4, 5)], True, ALL),
    "max_all": (lambda x: x.max(), [(2, 3, 4)], False, ALL),
    "var": (lambda x: x.var(1), [(2, 8, 3)], False, ALL),
    "cumsum": (lambda x: x.cumsum(-1), [(2, 3, 8)], False, ALL),
    "conv_cumsum_channels": (lambda x: x.cumsum(1), [(1, 3, 4, 5)], True, ALL),
    "conv_var_population": (lambda x: x.var((2, 3), correction=0, keepdim=True), [(1, 3, 4, 5)], True, ALL),
}


def _params(flavour):
    return [pytest.param(name, id=f"{name}_{flavour}") for name, (*_, flavours) in CASES.items()
            if flavour in flavours]


def _inputs(shapes) -> tuple:
    """Seeded float inputs of the given shapes; a tensor in ``shapes`` is an input as it is (int32 positions)."""
    floats = iter(seed_inputs(*[s for s in shapes if not isinstance(s, torch.Tensor)]))
    return tuple(s.clone() if isinstance(s, torch.Tensor) else next(floats) for s in shapes)


def _case(name):
    fn, shapes, conv, _ = CASES[name]
    torch.manual_seed(0)
    return Op(fn, conv).eval(), _inputs(shapes)


OP_TABLE = OpTable({name: case[-1] for name, case in CASES.items()}, _case)


@pytest.mark.parametrize("name", _params("fp"))
def test_shape_op_fp(harness, name):
    module, inputs = _case(name)
    harness.fp(module, inputs)


@pytest.mark.parametrize("name", _params("int"))
def test_shape_op_int(harness, name):
    module, inputs = _case(name)
    harness.int(module, inputs)


@pytest.mark.parametrize("name", _params("u55"))
def test_shape_op_u55(harness, name):
    module, inputs = _case(name)
    harness.ethosu(module, inputs, "ethos-u55-128", case=name)


@pytest.mark.parametrize("name", _params("u85"))
def test_shape_op_u85(harness, name):
    module, inputs = _case(name)
    harness.ethosu(module, inputs, "ethos-u85-256")


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
    module, inputs = Op(CASES["gather"][0]).eval(), seed_inputs((2, 3, 3))
    [left] = harness.cpu_compute(harness.compile(module, inputs, "ethos-u55-128", quantize=True))
    assert left.target == "aten.gather.default" and "GATHER" in left.reason and "Ethos-U55" in left.reason


def test_index_select_with_run_time_indices_refused_with_reason(harness):
    inputs = (seed_inputs((2, 3, 5))[0], torch.tensor([2, 0]))
    [left] = harness.cpu_compute(harness.compile(IndexByInput(), inputs, "TOSA-1.0+FP", quantize=False))
    assert left.target == "aten.index_select.default" and "int64" in left.reason and "index" in left.reason


@pytest.mark.parametrize("name,op", [("index_rows", "GATHER"), ("index_put_rows", "SCATTER")])
def test_run_time_indexing_refused_on_u55_with_reason(harness, name, op):
    """Ethos-U55/U65 have neither GATHER nor SCATTER: the indexing stays on the CPU, the reason says why."""
    module, inputs = _case(name)
    left = harness.cpu_compute(harness.compile(module, inputs, "ethos-u55-128", quantize=True))
    assert [p for p in left if op in p.reason and "Ethos-U55/U65" in p.reason], left


def test_index_put_accumulate_refused_with_reason(harness):
    """A scatter-add has no TOSA op (SCATTER writes each row once)."""
    module = Op(lambda c, pos, v: c.index_put((pos,), v, accumulate=True)).eval()
    compiled = harness.compile(module, _inputs([(16, 4), POSITIONS, (2, 4)]), "TOSA-1.0+FP", quantize=False)
    [left] = harness.cpu_compute(compiled)
    assert left.target == "aten.index_put.default" and "accumulate" in left.reason


def test_integer_cumsum_to_int64_refused_with_reason(harness):
    """Integers sum to int64 in PyTorch, which TOSA lacks: the reason names the dtype argument to pass."""
    module = Op(lambda x: (x > 0).to(torch.int32).cumsum(-1)).eval()
    compiled = harness.compile(module, seed_inputs((2, 8)), "TOSA-1.0+FP", quantize=False)
    reasons = [p.reason for p in harness.cpu_compute(compiled) if p.target == "aten.cumsum.default"]
    assert reasons and "dtype=torch.int32" in reasons[0]


def test_negative_padding_refused_with_reason(harness):
    module, inputs = Op(lambda x: F.pad(x, (-1, 1))).eval(), seed_inputs((2, 3, 5))
    [left] = harness.cpu_compute(harness.compile(module, inputs, "TOSA-1.0+FP", quantize=False))
    assert left.target == "aten.constant_pad_nd.default" and "negative padding" in left.reason


def test_rank_above_six_refused_with_reason(harness):
    module, inputs = Op(lambda x: x.reshape(1, 1, 2, 1, 3, 1, 4) * 2).eval(), seed_inputs((2, 3, 4))
    compiled = harness.compile(module, inputs, "TOSA-1.0+FP", quantize=False)
    left = {p.target: p.reason for p in harness.cpu_compute(compiled)}
    assert "exceeds TOSA's limit of 6" in left["aten.view.default"]
