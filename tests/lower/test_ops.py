"""Every op table, one family, four ways: _fp (TOSA FP vs PyTorch), _int (TOSA INT vs the fake-quantized model),
_u55 and _u85 (quantized, compiled by Vela with every op on the NPU; on U55/U65 the command stream simulated bit for
bit); _u55_refused, what Ethos-U55/U65 cannot run stays on the CPU with the reason. The 16-bit table (a16w8) also
checks that its delegates take int16 activations and hold the case's TOSA op, and simulates its U85 streams."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from support.npu import assert_u85_bit_exact, ethosu_delegates
from support.op_cases import Atan2, seed_inputs
from support.op_tables import TABLES
from support.op_tables.ops import Softmax
from support.shared import case_key

pytestmark = pytest.mark.numerics


def _params(flavour: str) -> list:
    return [param for table in TABLES for param in table.params(flavour)]


def _assert_int16_op(compiled, tosa_op: str):
    """Every delegate's activations are int16 (no int8 tensor crosses its boundary), and one holds ``tosa_op``."""
    from tosakit.program import LoweredBackendModule
    from tosakit.runtime.tosa_validate import check_tosa

    delegates = [m for m in compiled.edge.program.graph_module.children() if isinstance(m, LoweredBackendModule)]
    assert delegates
    for m in delegates:
        io = check_tosa(m.tosa, "delegate", 1 << 31)
        dtypes = {t.dtype for t in io.inputs + io.outputs}
        assert "INT16" in dtypes and dtypes <= {"INT16", "INT32", "BOOL"}, dtypes
    assert any(tosa_op in d.tosa_ops for d in compiled.edge.delegates)


def _check(table, name, compiled):
    """The table's own checks of a quantized case (the 16-bit table's int16 activations and TOSA op)."""
    if table.cases[name].tosa_op is not None:
        _assert_int16_op(compiled, table.cases[name].tosa_op)


@pytest.mark.parametrize("table,name", _params("fp"))
def test_op_fp(harness, table, name):
    module, inputs = table.build(name)
    harness.fp(module, inputs)


@pytest.mark.parametrize("table,name", _params("int"))
def test_op_int(harness, table, name):
    module, inputs = table.build(name)
    _check(table, name, harness.int(module, inputs, **table.compile_kw()))


@pytest.mark.parametrize("table,name", _params("u55"))
def test_op_u55(harness, table, name):
    module, inputs = table.build(name)
    _check(table, name, harness.ethosu(module, inputs, "ethos-u55-128", case=name, **table.compile_kw()))


@pytest.mark.parametrize("table,name", _params("u85"))
def test_op_u85(harness, streams, table, name):
    """Its streams are kept for test_ethosu_sim's test_op_case_u85 (the simulator on the same compile)."""
    module, inputs = table.build(name)
    compiled = harness.ethosu(module, inputs, "ethos-u85-256", **table.compile_kw())
    streams.put(case_key(table, name, "ethos-u85-256"), compiled)
    _check(table, name, compiled)
    if table.u85_seeds:
        assert_u85_bit_exact(ethosu_delegates(compiled), seeds=table.u85_seeds)


@pytest.mark.parametrize("table,name", [param for table in TABLES for param in table.refused_params()])
def test_op_u55_refused(harness, table, name):
    """What Ethos-U55/U65 cannot run (comparisons, logic, selection, bool casts; MATMUL, SELECT or GATHER in int16)
    stays on the CPU, every reason naming the target's limit (not a missing lowering)."""
    module, inputs = table.build(name)
    compiled = harness.compile(module, inputs, "ethos-u55-128", quantize=True, **table.compile_kw())
    reasons = [p.reason for p in harness.cpu_compute(compiled)]
    assert reasons, "nothing was left on the CPU"
    assert all(table.u55_limit in r for r in reasons), reasons
    assert table.cases[name].u55_reason is None or table.cases[name].u55_reason in reasons, reasons
    assert not any("no int16 (a16w8) lowering" in r for r in reasons), reasons


def test_float_softmax_runs_on_the_cpu_without_delegation(harness):
    """The tutorial's point: the integer-only Ethos-U55 cannot take a float softmax; without --delegate
    it runs on the CPU's portable kernel, and delegating it unquantized is refused with the ways out."""
    from tosakit.errors import TosakitError

    compiled = harness.compile(Softmax(), seed_inputs((2, 10)), "ethos-u55-128", quantize=False, delegate=False)
    assert not compiled.edge.delegates and compiled.program.emitted.kernel_ops == ["aten::_softmax.out"]
    with pytest.raises(TosakitError, match="runs integers only: the model is not quantized"):
        harness.compile(Softmax(), seed_inputs((2, 10)), "ethos-u55-128", quantize=False)


def test_quantized_softmax_runs_on_the_npu(harness):
    """A quantized softmax is decomposed before quantization (amax, sub, exp, sum, reciprocal, mul, each
    with its own qparams), so the whole model is one Ethos-U55 delegate with TABLE ops for exp/reciprocal."""
    model = nn.Sequential(nn.Linear(16, 8), nn.Softmax(dim=-1), nn.Linear(8, 4)).eval()
    compiled = harness.compile(model, seed_inputs((1, 16)), "ethos-u55-128", quantize=True)
    harness.assert_delegated(compiled)
    [delegate] = compiled.edge.delegates
    assert delegate.tosa_ops.get("TABLE", 0) >= 2 and "REDUCE_SUM" in delegate.tosa_ops
    harness.assert_checks(compiled, seed_inputs((1, 16)))


def test_op_without_lowering_runs_on_cpu_between_delegates(harness, tmp_path, et_oracle):
    """The rest is delegated, the op runs on the CPU between dequantize and quantize, the report says
    why, and the mixed program loads in the ExecuTorch runtime."""
    inputs = seed_inputs((1, 16))
    compiled = harness.compile(Atan2().eval(), inputs, "ethos-u55-128", quantize=True)
    [left] = harness.cpu_compute(compiled)
    assert left.target == "aten.atan2.default" and left.reason == "no TOSA lowering for aten.atan2.default"
    assert len(compiled.edge.delegates) == 2
    assert "aten::atan2.out" in compiled.program.emitted.kernel_ops
    harness.assert_checks(compiled, inputs)
    path = tmp_path / "mixed.pte"
    compiled.program.save(path)
    assert et_oracle.load(path) == ["forward"]


class Sigmoid(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x)


def test_a_lowering_rule_fault_names_the_node(monkeypatch):
    """A rule's own bug (an AttributeError deep in it) surfaces as one error naming the node and its source line,
    not as a traceback."""
    from tosakit.errors import TosakitError
    from tosakit.flow import compile
    from tosakit.lower import lowering

    sigmoid = torch.ops.aten.sigmoid.default
    rule = lowering.RULES[sigmoid]

    def broken(ctx, node):
        raise AttributeError("'NoneType' object has no attribute 'zp'")

    monkeypatch.setitem(lowering.RULES, sigmoid, lowering.Rule(rule.target, broken, rule.support))
    with pytest.raises(TosakitError, match=r"internal error lowering aten\.sigmoid\.default \(node sigmoid, .*"
                                           r"test_ops\.py:\d+\) for TOSA-1\.0\+FP: AttributeError"):
        compile(Sigmoid().eval(), (torch.randn(1, 4),), "TOSA-1.0+FP")
