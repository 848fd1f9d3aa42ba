"""Vela's limits as data: the partitioner leaves what Vela would refuse on the CPU, and says why."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from support.op_cases import Atan2
from tosakit.backends.ethosu.support import U55_U65, U85, limits_for
from tosakit.flow import compile
from tosakit.lower.tosa_graph import Attr, DType, EmittedOp, TensorInfo


def _op(name, inputs, output, attr=Attr("X")):
    info = lambda shape, dtype=DType.INT8, data=None: TensorInfo("t", shape, dtype, data)  # noqa: E731
    return EmittedOp(name, tuple(info(*i) for i in inputs), info(*output), attr)


def test_limits_in_words():
    pool = _op("AVG_POOL2D", [((1, 30, 30, 8),)], ((1, 6, 26, 8),), Attr("AvgPool2dAttribute", ([25, 5], [1, 1],
                                                                                                  [1, 1, 0, 0], 0)))
    assert U55_U65.refusal(pool) == "AVG_POOL2D on Ethos-U55/U65: kernel 25x5 with padding exceeds 8x8"
    assert U85.refusal(pool) is None
    gather = _op("GATHER", [((1, 10, 4),), ((1, 3), DType.INT32)], ((1, 3, 4),))
    assert U55_U65.refusal(gather) == "TOSA GATHER is not supported on Ethos-U55/U65"
    conv = _op("CONV2D", [((1, 8, 8, 3),), ((4, 3, 3, 3), DType.INT8, None), ((4,), DType.INT32, None)],
               ((1, 2, 2, 4), DType.INT32), Attr("Conv2dAttribute", ([0, 0, 0, 0], [4, 4], [1, 1], False, 0)))
    assert "stride 4x4 exceeds 3" in U55_U65.refusal(conv)
    fp = _op("ADD", [((1, 4), DType.FP32), ((1, 4), DType.FP32)], ((1, 4), DType.FP32))
    assert "integers only" in U85.refusal(fp)
    assert limits_for("ethos-u85-512") is U85 and limits_for("ethos-u65-256") is U55_U65


class PaddedPool(nn.Module):
    """A 9x9 average pool with padding between convolutions: U55 pools with padding up to 8x8."""

    def __init__(self):
        super().__init__()
        self.first = nn.Conv2d(3, 8, 3, padding=1)
        self.pool = nn.AvgPool2d(9, 1, 1, count_include_pad=False)
        self.last = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        return self.last(self.pool(torch.relu(self.first(x))))


def test_vela_limit_keeps_one_op_on_the_cpu():
    """U55 refuses the pool (Vela agrees with its report), so it alone runs on the CPU; U85 takes it."""
    inputs = (torch.randn(1, 3, 20, 20),)
    compiled = compile(PaddedPool().eval(), inputs, "ethos-u55-128", quantize=True)
    cpu = [p for p in compiled.edge.placements if p.placement == "cpu" and p.compute]
    assert [(p.node, p.reason) for p in cpu] == [
        ("avg_pool2d", "AVG_POOL2D on Ethos-U55/U65: kernel 9x9 with padding exceeds 8x8")]
    assert len(compiled.edge.delegates) == 2 and all(d.report.cpu_ops == 0 for d in compiled.edge.delegates)
    u85 = compile(PaddedPool().eval(), inputs, "ethos-u85-256", quantize=True)
    assert len(u85.edge.delegates) == 1 and not [p for p in u85.edge.placements
                                                 if p.placement == "cpu" and p.compute]


def test_report_limits_vela_goes_beyond_are_not_enforced():
    """Vela's report says conv stride <= 3 on U55, but Vela compiles stride 4: the NPU keeps it."""
    compiled = compile(nn.Conv2d(8, 8, 5, stride=4).eval(), (torch.randn(1, 8, 24, 24),), "ethos-u55-128",
                       quantize=True)
    assert len(compiled.edge.delegates) == 1 and compiled.edge.delegates[0].report.cpu_ops == 0


def test_partitioning_reuses_the_vela_compile(monkeypatch):
    """Validation compiles each partition once; the program stage reuses that result."""
    import tosakit.backends.registry as backends

    calls = []
    original = backends.preprocess
    monkeypatch.setattr(backends, "preprocess", lambda *a: calls.append(a[0]) or original(*a))
    compile(nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval(), (torch.randn(1, 3, 8, 8),), "ethos-u55-128",
            quantize=True)
    assert calls == ["EthosUBackend"]


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_ethosu_reasons_reach_the_report(target):
    """An op no target lowers, between quantized layers on Ethos-U: the placement names it and says why."""
    compiled = compile(Atan2(8).eval(), (torch.randn(1, 8),), target, quantize=True)
    [left] = [p for p in compiled.edge.placements if p.placement == "cpu" and p.compute]
    assert left.node == "atan2" and left.reason == "no TOSA lowering for aten.atan2.default"


def test_vela_is_the_final_check(monkeypatch):
    """With no limits table at all, Vela's own refusal still keeps the offending node on the CPU:
    each operator of the type Vela named is compiled alone to find which one it refuses."""
    import tosakit.backends.ethosu.backend as ethosu
    from tosakit.backends.ethosu.support import TargetLimits

    monkeypatch.setattr(ethosu, "limits_for", lambda target: TargetLimits("nothing", frozenset(), ()))
    compiled = compile(PaddedPool().eval(), (torch.randn(1, 3, 20, 20),), "ethos-u55-128", quantize=True)
    cpu = {p.node: p.reason for p in compiled.edge.placements if p.placement == "cpu" and p.compute}
    assert list(cpu) == ["avg_pool2d"] and cpu["avg_pool2d"].startswith("Vela refused TOSA AVG_POOL2D: ")
    assert all(d.report.cpu_ops == 0 for d in compiled.edge.delegates)
