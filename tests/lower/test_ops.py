"""Every lowered op, four ways: _fp (TOSA FP vs PyTorch), _int (TOSA INT vs the fake-quantized
model), _u55 and _u85 (quantized, compiled by Vela with every op on the NPU)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from op_cases import OpTable, build_case, flavour_params, seed_inputs

pytestmark = pytest.mark.numerics


class Add(nn.Module):
    def forward(self, x, y):
        return x + y


class AddScalar(nn.Module):
    def forward(self, x):
        return x + 0.5


class AddBroadcast(nn.Module):
    def forward(self, x, y):
        return x + y  # y: [1, C, 1, 1]


class AddRelu(nn.Module):
    def forward(self, x, y):
        return torch.relu(x + y)


class Sub(nn.Module):
    def forward(self, x, y):
        return x - y


class Mul(nn.Module):
    def forward(self, x, y):
        return x * y


class Relu(nn.Module):
    def forward(self, x):
        return torch.relu(x)


class Hardtanh(nn.Module):
    def forward(self, x):
        return nn.functional.hardtanh(x, -0.5, 1.5)


class Relu6(nn.Module):
    def forward(self, x):
        return nn.functional.relu6(x * 4)


class ConvBnRelu6(nn.Module):
    """Conv with batch norm folded into it and a fused ReLU6 (MobileNet's block)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.act = nn.ReLU6()
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Mean(nn.Module):
    def __init__(self, dims, keepdim):
        super().__init__()
        self.dims, self.keepdim = dims, keepdim

    def forward(self, x):
        return x.mean(self.dims, keepdim=self.keepdim)


class Flatten(nn.Module):
    def forward(self, x):
        return torch.flatten(torch.relu(x), 1)


class ViewReshape(nn.Module):
    def forward(self, x):
        y = x.view(x.shape[0], -1, 4)
        return y.reshape(x.shape[0], 4, -1) * 2


class Permute(nn.Module):
    def forward(self, x):
        return torch.relu(x.permute(0, 2, 3, 1)).reshape(1, -1)


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class Sigmoid(nn.Module):
    def forward(self, x):
        return torch.sigmoid(x)


# name -> (module factory, input shapes, which flavours apply)
ALL = ("fp", "int", "u55", "u85")
CASES = {
    "conv2d_bias": (lambda: nn.Conv2d(8, 16, 3, 1, 1), [(1, 8, 16, 16)], ALL),
    "conv2d_stride2_pad1": (lambda: nn.Conv2d(8, 16, 3, 2, 1), [(1, 8, 17, 17)], ALL),
    "conv2d_1x1_nobias": (lambda: nn.Conv2d(16, 32, 1, bias=False), [(1, 16, 8, 8)], ALL),
    "conv2d_5x5_pad2": (lambda: nn.Conv2d(4, 8, 5, 1, 2), [(1, 4, 12, 12)], ALL),
    "conv2d_depthwise": (lambda: nn.Conv2d(16, 16, 3, 1, 1, groups=16), [(1, 16, 12, 12)], ALL),
    "conv2d_depthwise_stride2": (lambda: nn.Conv2d(16, 16, 3, 2, 1, groups=16, bias=False), [(1, 16, 14, 14)], ALL),
    "conv2d_depthwise_multiplier": (lambda: nn.Conv2d(8, 16, 3, 1, 1, groups=8), [(1, 8, 10, 10)], ALL),
    "conv2d_bn_relu6": (ConvBnRelu6, [(1, 8, 12, 12)], ALL),
    "conv1d": (lambda: nn.Conv1d(8, 16, 3, 1, 1), [(1, 8, 32)], ALL),
    "linear": (lambda: nn.Linear(32, 16), [(2, 32)], ALL),
    "linear_3d": (lambda: nn.Linear(16, 8), [(1, 5, 16)], ALL),
    "linear_relu": (lambda: nn.Sequential(nn.Linear(32, 16), nn.ReLU()), [(1, 32)], ALL),
    "add": (Add, [(1, 8, 6, 6), (1, 8, 6, 6)], ALL),
    "add_scalar": (AddScalar, [(1, 8, 6, 6)], ALL),
    "add_broadcast": (AddBroadcast, [(1, 8, 6, 6), (1, 8, 1, 1)], ALL),
    "add_relu": (AddRelu, [(2, 16), (2, 16)], ALL),
    "sub": (Sub, [(1, 4, 5, 5), (1, 4, 5, 5)], ALL),
    "mul": (Mul, [(1, 4, 5, 5), (1, 4, 5, 5)], ALL),
    "relu": (Relu, [(1, 8, 5, 5)], ALL),
    "hardtanh": (Hardtanh, [(1, 8, 5, 5)], ALL),
    "relu6": (Relu6, [(1, 8, 5, 5)], ALL),
    "adaptive_avg_pool2d": (lambda: nn.AdaptiveAvgPool2d(1), [(1, 16, 7, 7)], ALL),
    "mean_hw_keepdim": (lambda: Mean((2, 3), True), [(1, 8, 6, 6)], ALL),
    "mean_hw": (lambda: Mean((-1, -2), False), [(1, 8, 6, 6)], ALL),
    "mean_last": (lambda: Mean((-1,), True), [(1, 4, 16)], ALL),
    "avg_pool2d": (lambda: nn.AvgPool2d(2, 2), [(1, 8, 8, 8)], ALL),
    "max_pool2d": (lambda: nn.MaxPool2d(3, 2, 1), [(1, 8, 9, 9)], ALL),
    "flatten": (Flatten, [(1, 8, 2, 2)], ALL),
    "view_reshape": (ViewReshape, [(2, 4, 8)], ALL),
    "permute": (Permute, [(1, 4, 3, 5)], ALL),
    "softmax": (Softmax, [(2, 10)], ("fp",)),
    "sigmoid": (Sigmoid, [(1, 4, 8)], ALL),
}


def _params(flavour):
    return flavour_params(CASES, flavour)


def _case(name):
    return build_case(CASES, name)


OP_TABLE = OpTable({name: case[-1] for name, case in CASES.items()}, _case)


@pytest.mark.parametrize("name", _params("fp"))
def test_op_fp(harness, name):
    module, inputs = _case(name)
    harness.fp(module, inputs)


@pytest.mark.parametrize("name", _params("int"))
def test_op_int(harness, name):
    module, inputs = _case(name)
    harness.int(module, inputs)


@pytest.mark.parametrize("name", _params("u55"))
def test_op_u55(harness, name):
    module, inputs = _case(name)
    harness.ethosu(module, inputs, "ethos-u55-128", case=name)


@pytest.mark.parametrize("name", _params("u85"))
def test_op_u85(harness, name):
    module, inputs = _case(name)
    harness.ethosu(module, inputs, "ethos-u85-256")


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


class Atan2(nn.Module):
    """A float op no target lowers (atan2), between quantized layers."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Linear(16, 8), nn.Linear(8, 4)

    def forward(self, x):
        y = self.first(x)
        return self.second(torch.atan2(y, y + 3))


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
