"""The Ethos-U55/U65 command-stream simulator against the TOSA reference model, bit for bit: the same TOSA
compiled by Vela and run by the simulator from the payload's bytes (command stream, weights, I/O table)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tosakit.backends.ethosu.payload import parse_payload
from tosakit.errors import TosakitError
from tosakit.flow import compile
from tosakit.program import LoweredBackendModule
from tosakit.runtime.ethosu.memory import NpuAccessError
from tosakit.runtime.ethosu.simulate import simulate
from tosakit.runtime.refmodel import run_tosa

pytestmark = pytest.mark.numerics


def delegates(model: nn.Module, inputs: tuple, target: str, **options):
    """(TOSA, parsed payload) of each Ethos-U delegate of ``model`` compiled for ``target``."""
    torch.manual_seed(0)
    c = compile(model.eval(), inputs, target, quantize=True, calibration=[inputs], **options)
    found = [(m.tosa, parse_payload(m.processed_bytes)) for m in c.edge.program.graph_module.children()
             if isinstance(m, LoweredBackendModule)]
    assert found, "nothing was delegated"
    return found


def random_inputs(payload, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for t in payload.inputs:
        info = np.iinfo(f"i{t.elem_size}")
        out.append(rng.integers(info.min, info.max, size=t.shape, endpoint=True).astype(f"i{t.elem_size}"))
    return out


def assert_bit_exact(model, inputs, target="ethos-u55-128", seeds=(0, 1, 2), **options):
    for tosa, payload in delegates(model, inputs, target, **options):
        for seed in seeds:
            xs = random_inputs(payload, seed)
            want = run_tosa(tosa, [x.reshape(_tosa_shape(x, t)) for x, t in zip(xs, payload.inputs)])
            got = simulate(payload, xs, target).outputs
            assert len(got) == len(want)
            for g, w in zip(got, want):
                w = np.asarray(w)
                assert g.size == w.size
                diff = np.flatnonzero(g.reshape(-1).astype(np.int64) != w.reshape(-1).astype(np.int64))
                assert diff.size == 0, (f"{diff.size} of {w.size} values differ, first at {diff[0]}: "
                                        f"simulated {g.reshape(-1)[diff[0]]}, reference {w.reshape(-1)[diff[0]]}")


def _tosa_shape(x, t):
    shape = list(t.shape)
    while len(shape) > 1 and shape[0] == 1:
        shape.pop(0)
    return shape


class Conv(nn.Module):
    def __init__(self, cin=3, cout=8, k=3, stride=1, padding=1, dilation=1, groups=1, relu=True):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, padding, dilation, groups)
        self.relu = relu

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(y) if self.relu else y


CONVS = {
    "3x3": (Conv(), (1, 3, 8, 8)),
    "1x1": (Conv(16, 24, 1, padding=0, relu=False), (1, 16, 6, 6)),
    "5x5_stride2": (Conv(4, 20, 5, stride=2, padding=2), (1, 4, 11, 11)),
    "3x3_dilation2": (Conv(8, 8, 3, padding=2, dilation=2), (1, 8, 9, 9)),
    "depthwise": (Conv(16, 16, 3, groups=16), (1, 16, 7, 7)),
    "deep": (Conv(40, 70, 3), (1, 40, 5, 5)),
}


@pytest.mark.parametrize("case", CONVS)
def test_conv_u55(case):
    model, shape = CONVS[case]
    assert_bit_exact(model, (torch.randn(shape),))


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(48, 10)

    def forward(self, x):
        return self.fc(x)


def test_linear_u55():
    assert_bit_exact(Linear(), (torch.randn(1, 48),))


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_pool_u55(pool):
    layer = nn.MaxPool2d(2) if pool == "max" else nn.AvgPool2d(3, stride=1, padding=1)
    assert_bit_exact(layer, (torch.randn(1, 16, 8, 8),))


def test_digits_u55():
    from tosakit.zoo import MODELS

    model, inputs = MODELS["digits"].factory()
    assert_bit_exact(model, inputs)


def test_scratch_read_before_write_names_the_command():
    """A payload whose input offset is moved: the first read of the real offset is of bytes nothing wrote."""
    (tosa, payload), = delegates(CONVS["3x3"][0], (torch.randn(1, 3, 8, 8),), "ethos-u55-128")
    t = payload.inputs[0]
    payload.inputs[0] = type(t)(t.shape, t.elem_size, t.offset + 64 * 1024, t.region)
    payload.scratch_size += 128 * 1024
    with pytest.raises(NpuAccessError, match=r"command at offset 0x[0-9a-f]+ \(NPU_OP_\w+\) reads byte"):
        simulate(payload, random_inputs(payload, 0), "ethos-u55-128")


def test_scratch_too_small_names_the_command():
    (tosa, payload), = delegates(CONVS["3x3"][0], (torch.randn(1, 3, 8, 8),), "ethos-u55-128")
    payload.scratch_size = max(t.offset + int(np.prod(t.shape)) * t.elem_size for t in payload.inputs)
    with pytest.raises(TosakitError, match=r"command at offset 0x[0-9a-f]+ \(NPU_OP_\w+\) (writes|reads) bytes"):
        simulate(payload, random_inputs(payload, 0), "ethos-u55-128")
