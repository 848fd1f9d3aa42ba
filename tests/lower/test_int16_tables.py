"""int16 (a16w8) functions of one input, TOSA's interpolating int16 TABLE (``Lowering.table16``), three ways on
every int16 input: _int (the TOSA on the reference model against the fake-quantized model, evaluated exactly),
_u55 and _u85 (compiled by Vela with the function on the NPU as a 16-bit LUT activation, simulated bit for bit
against the reference model)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from support.npu import assert_npu_bit_exact, ethosu_delegates
from support.op_cases import Fn
from tosakit.flow import compile
from tosakit.program import LoweredBackendModule
from tosakit.quantize import get_symmetric_a16w8_quantization_config
from tosakit.quantize.qdq import is_dequantize, is_quantize, qparams_of
from tosakit.runtime.delegates import evaluate_exact, run_delegate
from tosakit.runtime.ethosu.commands import decode, disassemble
from tosakit.runtime.ethosu.simulate import require_simulated, simulate
from tosakit.runtime.tosa_inprocess import run_tosa
from tosakit.specs import EthosUCompileSpec

pytestmark = pytest.mark.numerics

FUNCTIONS = {  # name: (function, calibration range: where a Llama decoder computes it)
    "exp": (torch.exp, -10.0, 0.0),  # softmax, its max subtracted
    "sigmoid": (torch.sigmoid, -8.0, 8.0),
    "silu": (F.silu, -8.0, 8.0),  # the MLP's gate
    "tanh": (torch.tanh, -4.0, 4.0),
    "rsqrt": (torch.rsqrt, 0.01, 4.0),  # RMSNorm: the mean of squares plus eps
    "reciprocal": (torch.reciprocal, 1.0, 64.0),  # softmax's sum
}
# The largest difference from the fake-quantized model, in output steps, over the calibration range: one step where
# the function bends little within a segment (the 128 inputs between two entries); more where a straight line
# cannot follow it there: exp near 0, 1/x near 1 (x at 1.12: 224 steps of 32767), and 1/sqrt(x) next to its pole
# at 0 (x at 0.01, in the segment from 0: 4493 steps of 32767).
PINNED_MAX = {"exp": 5, "sigmoid": 1, "silu": 1, "tanh": 1, "rsqrt": 4493, "reciprocal": 224}

INPUTS = torch.arange(-32768, 32768, dtype=torch.int16).reshape(1, 256, 256)  # every int16 value, once


@functools.cache
def _compiled(name: str, target: str):
    fn, lo, hi = FUNCTIONS[name]
    calibration = (torch.linspace(lo, hi, INPUTS.numel()).reshape(INPUTS.shape),)
    return compile(Fn(fn).eval(), calibration, EthosUCompileSpec(target), quantize=True, calibration=[calibration],
                   config=get_symmetric_a16w8_quantization_config())


def _delegate(name: str, target: str) -> LoweredBackendModule:
    compiled = _compiled(name, target)
    on_cpu = [p.target for p in compiled.edge.placements if p.placement == "cpu" and p.compute]
    assert not on_cpu, on_cpu
    (module,) = [m for m in compiled.edge.program.graph_module.children() if isinstance(m, LoweredBackendModule)]
    return module


def _tolerance(fn, q_in, q_out) -> np.ndarray:
    """Per int16 input, the most the TABLE may differ from the fake-quantized model. Entry i is g(x_i) less half of
    the line's excess over g at the middle of the segment to its right, in output steps, rounded (g: the function
    clamped to the output's range; see ``Lowering.table16``). With L(x) the line through the unrounded entries,
    the result is round(L(x) + r) for some |r| <= 1/2 and the model's is round(g(x)): they differ by at most
    floor(1.5 + |L(x) - g(x)|) steps, one wherever the line stays within half a step of g."""

    def steps(x: torch.Tensor) -> torch.Tensor:
        return torch.clamp(fn(x * q_in.s) / q_out.s, q_out.qmin, q_out.qmax)

    grid = steps(torch.arange(-32768, 32769, 64, dtype=torch.float64))
    at, middle = grid[::2], grid[1::2]
    excess = torch.cat([(at[:-1] + at[1:]) / 2 - middle, torch.zeros(1, dtype=torch.float64)])
    entries = torch.clamp(at - excess / 2, q_out.qmin, q_out.qmax)
    x = torch.arange(-32768, 32768, dtype=torch.int64)
    segment, fraction = (x + 32768) >> 7, ((x + 32768) & 127).double() / 128
    line = entries[segment] + (entries[segment + 1] - entries[segment]) * fraction
    return torch.floor(1.5 + (line - steps(x.double())).abs()).numpy()


@pytest.mark.parametrize("name", FUNCTIONS)
def test_table16_int(name):
    """Every int16 input through the delegate's TOSA on the reference model, against the fake-quantized model
    evaluated exactly: over the calibration range, each within its derived bound, the largest as pinned."""
    module = _delegate(name, "ethos-u55-128")
    graph = module.original_module
    q_in = next(qparams_of(n, graph) for n in graph.graph.nodes if is_dequantize(n))
    q_out = next(qparams_of(n, graph) for n in graph.graph.nodes if is_quantize(n))
    got = run_delegate(module, [INPUTS])[0].numpy().astype(np.int64).ravel()
    want = evaluate_exact(graph, INPUTS)[0].numpy().astype(np.int64).ravel()
    _, lo, hi = FUNCTIONS[name]
    real = INPUTS.numpy().ravel() * q_in.s
    used = (real >= lo) & (real <= hi)
    diff, bound = np.abs(got - want)[used], _tolerance(FUNCTIONS[name][0], q_in, q_out)[used]
    over = np.flatnonzero(diff > bound)
    assert over.size == 0, f"{diff[over].size} inputs beyond their bound, first at {real[used][over[0]]:.4g}: " \
                           f"{diff[over[0]]} steps, bound {bound[over[0]]:.0f}"
    assert diff.max() == PINNED_MAX[name]


def _bit_exact(name: str, target: str, function: str) -> None:
    """Vela puts the function on the NPU as ``function``; every int16 input simulated, and seeded ones through
    ``assert_npu_bit_exact``, equal the reference model's."""
    (found,) = ethosu_delegates(_compiled(name, target))
    tosa, payload = found
    listing = "\n".join(disassemble(require_simulated(decode(payload.cmd_data))))
    assert f"activation_function = {function}" in listing
    want = np.asarray(run_tosa(tosa, [INPUTS.numpy()])[0]).ravel()
    got = simulate(payload, [INPUTS.numpy()]).outputs[0].ravel()
    assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} of {want.size} values differ"
    assert_npu_bit_exact(tosa, payload, seeds=(0,))


@pytest.mark.parametrize("name", FUNCTIONS)
def test_table16_u55(name):
    _bit_exact(name, "ethos-u55-128", "ACTIVATION_FUNCTION_TABLE_0")


@pytest.mark.parametrize("name", FUNCTIONS)
def test_table16_u85(name):
    _bit_exact(name, "ethos-u85-256", "ACTIVATION_FUNCTION_LUT_S16_S16")
