"""Weights that fit the NPU: a8w4 (int8 activations, weights in -7..7), lowered as TOSA INT4 where the target has
the int4 extension, and what Vela makes of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import assert_npu_bit_exact, ethosu_delegates

from tosakit import get_symmetric_a8w4_quantization_config
from tosakit.flow import compile
from tosakit.lower.tosa_graph import Op
from tosakit.runtime import evaluate_exact, run_edge


def _convs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 10)).eval()
    return model, (torch.randn(1, 16, 8, 8),)


def _a8w4(target, model, inputs):
    return compile(model, inputs, target, quantize=True, config=get_symmetric_a8w4_quantization_config(is_qat=False))


def _weights(tosa: bytes) -> list[tuple[str, np.ndarray | None, str]]:
    """(weight dtype name, weight values when int8, weight zero point dtype name) of each CONV2D."""
    from serializer.tosa_serializer import DTypeNames
    from tosa.TosaGraph import TosaGraph

    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    tensors = {block.Tensors(i).Name().decode(): block.Tensors(i) for i in range(block.TensorsLength())}
    found = []
    for op in (block.Operators(i) for i in range(block.OperatorsLength())):
        if op.Op() == Op.CONV2D:
            w, zp = tensors[op.Inputs(1).decode()], tensors[op.Inputs(4).decode()]
            values = w.DataAsNumpy().view(np.int8) if DTypeNames[w.Type()] == "INT8" else None
            found.append((DTypeNames[w.Type()], values, DTypeNames[zp.Type()]))
    return found


def test_a8w4_config_is_executorchs():
    """ExecuTorch's semantics: per-channel symmetric weights in -7..7, int8 activations, QAT by default."""
    from torchao.quantization.pt2e.fake_quantize import FakeQuantize

    config = get_symmetric_a8w4_quantization_config()
    w = config.weight
    assert (w.quant_min, w.quant_max, w.dtype, w.qscheme) == (-7, 7, torch.int8, torch.per_channel_symmetric)
    assert config.input_activation.dtype == torch.int8
    assert issubclass(w.observer_or_fake_quant_ctr.p.func, FakeQuantize)
    assert not issubclass(get_symmetric_a8w4_quantization_config(is_qat=False).weight.observer_or_fake_quant_ctr.p.func,
                          FakeQuantize)


@pytest.mark.parametrize("target,storage", [("TOSA-1.0+INT+int4", "INT4"), ("TOSA-1.0+INT", "INT8")],
                         ids=["int4", "int"])
def test_a8w4_weights_are_int4_where_the_target_has_the_extension_int(target, storage):
    """With TOSA's int4 extension the convolution and linear weights (and their zero point) are INT4; without it
    INT8 holding -7..7. Either way the reference model's outputs equal the fake-quantized model's exactly."""
    model, inputs = _convs()
    compiled = _a8w4(target, model, inputs)
    [delegate] = [m for m in compiled.edge.program.graph_module.children() if hasattr(m, "tosa")]
    found = _weights(delegate.tosa)
    assert len(found) == 3 and {(w, zp) for w, _, zp in found} == {(storage, storage)}
    if storage == "INT8":
        assert all(int(np.abs(v).max()) <= 7 for _, v, _ in found)
    assert torch.equal(run_edge(compiled.edge, *inputs)[0], evaluate_exact(compiled.quantized, *inputs)[0])


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"], ids=["u55", "u85"])
def test_a8w4_runs_on_the_npu_with_half_the_weight_bytes_u55_u85(target):
    """Vela 5.2 takes the INT4 weights: everything on the NPU, the encoded weights at most 55% of int8's (4-bit
    values, fewer distinct ones), and the command stream simulated bit for bit against its TOSA."""
    model, inputs = _convs()
    a8w4 = _a8w4(target, model, inputs)
    int8 = compile(model, inputs, target, quantize=True)
    [d4], [d8] = a8w4.edge.delegates, int8.edge.delegates
    [(tosa, payload)] = ethosu_delegates(a8w4)
    assert d4.report.cpu_ops == 0 and {w for w, _, _ in _weights(tosa)} == {"INT4"}
    assert d4.report.weights_encoded_bytes <= 0.55 * d8.report.weights_encoded_bytes, \
        (d4.report.weights_encoded_bytes, d8.report.weights_encoded_bytes)
    assert_npu_bit_exact(tosa, payload)
