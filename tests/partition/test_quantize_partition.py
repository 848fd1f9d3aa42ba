"""Quantizer config selection, partitioner checks, and CPU-only programs in the ExecuTorch runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

from tosakit import (DontPartition, DontPartitionModule, DontPartitionName, EthosUCompileSpec, EthosUPartitioner,
                     EthosUQuantizer, VgfCompileSpec, VgfPartitioner, VgfQuantizer, get_symmetric_quantization_config,
                     to_edge_transform_and_lower)
from tosakit.flow import compile
from tosakit.quantize.qdq import is_quantize
from tosakit.runtime import check_delegates

pytestmark = pytest.mark.numerics


class Two(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.act = nn.ReLU()
        self.second = nn.Linear(8, 4)

    def forward(self, x):
        return self.second(self.act(self.first(x)))


def _inputs(*shape):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(0)),)


def _quantize(quantizer, model, inputs):
    gm = prepare_pt2e(torch.export.export(model.eval(), inputs).module(), quantizer)
    gm(*inputs)
    return convert_pt2e(gm)


def _annotated(quantizer, model=None, inputs=_inputs(2, 8)) -> set[str]:
    """Names of the nodes the quantizer annotated (before observers are inserted)."""
    gm = torch.export.export((model or Two()).eval(), inputs).module()
    quantizer.annotate(quantizer.transform_for_annotation(gm))
    return {n.name for n in gm.graph.nodes if n.meta.get("quantization_annotation") is not None}


def test_module_name_and_type_select_configs():
    config = get_symmetric_quantization_config()
    spec = VgfCompileSpec()
    assert _annotated(VgfQuantizer(spec).set_global(config)) == {"linear", "relu", "linear_1"}
    assert _annotated(VgfQuantizer(spec).set_global(config).set_module_name("second", None)) == {"linear", "relu"}
    assert _annotated(VgfQuantizer(spec).set_global(None).set_module_type(nn.Linear, config)) == {"linear", "linear_1"}
    assert _annotated(VgfQuantizer(spec).set_global(None).set_module_name("first", config)) == {"linear"}


class Sandwich(nn.Module):
    """A softmax left unquantized (float-only lowering) between quantized layers."""

    def __init__(self):
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.act = nn.Softmax(dim=-1)
        self.second = nn.Linear(8, 4)

    def forward(self, x):
        return self.second(self.act(self.first(x)))


def test_float_op_between_quantized_layers():
    """VGF (FP+INT): the unquantized softmax runs in float inside the delegate, with explicit
    (de)quantization around it; Ethos-U (INT only): it stays on the CPU and the report says why."""
    model, inputs = Sandwich(), _inputs(2, 8)
    config = get_symmetric_quantization_config()
    quantized = _quantize(VgfQuantizer(VgfCompileSpec()).set_global(config).set_module_type(nn.Softmax, None),
                          model, inputs)
    edge = to_edge_transform_and_lower(torch.export.export(quantized, inputs),
                                       partitioner=[VgfPartitioner(VgfCompileSpec())])
    [delegate] = edge.delegates
    assert delegate.tosa_ops.get("EXP") == 1 and delegate.tosa_ops.get("CAST", 0) >= 2  # (de)quantize
    assert all(c.passed for c in check_delegates(edge, inputs))
    spec = EthosUCompileSpec("ethos-u55-128")
    edge = to_edge_transform_and_lower(torch.export.export(quantized, inputs), partitioner=[EthosUPartitioner(spec)])
    placed = {p.node: p for p in edge.placements}
    assert placed["_softmax"].placement == "cpu" and "no integer (INT) lowering" in placed["_softmax"].reason
    assert len(edge.delegates) == 2


class SplitPartsApart(nn.Module):
    """GPT-2's fused projection split in parts, one part read by an op Ethos-U55 leaves on the CPU (a select)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 24)

    def forward(self, x):
        q, k, v = self.proj(x).split(8, dim=-1)
        return q * k, torch.where(v > 0, v, v * 0.5)


def test_a_split_part_read_on_the_cpu_leaves_no_float_delegate_output_u55():
    """Each part of a split dequantized tensor is its own dequantize and slice: the delegate that splits hands
    the CPU's part over quantized (it failed with 'cannot lower ... dequantizes a delegate output back to float')."""
    inputs = _inputs(2, 8)
    compiled = compile(SplitPartsApart().eval(), inputs, "ethos-u55-128", quantize=True)
    placed = {p.node: p for p in compiled.edge.placements}
    assert placed["where"].placement == "cpu" and compiled.edge.delegates
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


class GptConv1D(nn.Module):
    """transformers' GPT-2 Conv1D: addmm(bias, x, W) with W stored [in, out]."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 12) * 0.3)
        self.bias = nn.Parameter(torch.randn(12) * 0.1)

    def forward(self, x):
        return torch.addmm(self.bias, x.view(-1, 8), self.weight).view(2, 3, 12)


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_addmm_with_constant_weight_is_a_linear_layer_u55_u85(target):
    """GPT-2's Conv1D runs as a per-channel quantized linear layer on the NPU (it stayed on the CPU: 'no TOSA
    lowering for aten.addmm.default')."""
    inputs = _inputs(2, 3, 8)
    compiled = compile(GptConv1D().eval(), inputs, target, quantize=True)
    assert all(p.placement == "delegate" for p in compiled.edge.placements if "quantize" not in p.target)
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


class StandardizedConv(nn.Conv2d):
    """timm's ScaledStdConv2d (NF-Nets): the weight standardized in forward() by a batch norm in training mode."""

    def forward(self, x):
        w = nn.functional.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None,
                                     weight=torch.full((self.out_channels,), 0.5), training=True, momentum=0.0,
                                     eps=1e-6).reshape_as(self.weight)
        return nn.functional.conv2d(x, w, self.bias, self.stride, self.padding)


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_weights_computed_from_constants_are_folded_u55_u85(target):
    """A weight forward() computes from parameters alone (a standardized convolution's batch norm over its weight,
    an op of several outputs, of a whole weight tensor) is computed at compile time: the convolution runs on the
    NPU (it stayed on the CPU with its batch norm: timm:nf_regnet_b0 had 12 such convolutions there)."""
    torch.manual_seed(0)
    model = nn.Sequential(StandardizedConv(16, 96, 3, padding=1), nn.ReLU(), StandardizedConv(96, 128, 3)).eval()
    inputs = _inputs(1, 16, 8, 8)
    compiled = compile(model, inputs, target, quantize=True)
    placed = [p for p in compiled.edge.placements if "quantize" not in p.target]
    assert placed and all(p.placement == "delegate" for p in placed), [(p.node, p.reason) for p in placed]
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


class SamePaddedMaxPool(nn.Module):
    """timm's MaxPool2dSame: the input padded with -inf on the far sides, then a max pool without padding."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x):
        return nn.functional.max_pool2d(nn.functional.pad(self.conv(x), (0, 1, 0, 1), value=-float("inf")), 3, 2)


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_padding_with_minus_infinity_quantizes_u55_u85(target):
    """A -inf padding calibrates on its finite values and pads with the range's lowest integer: the pool runs on
    the NPU (timm:vit_tiny_r_s16_p8_224 failed to compile: 'cannot convert float NaN to integer')."""
    inputs = _inputs(1, 3, 16, 16)
    compiled = compile(SamePaddedMaxPool().eval(), inputs, target, quantize=True)
    placed = [p for p in compiled.edge.placements if "quantize" not in p.target]
    assert placed and all(p.placement == "delegate" for p in placed), [(p.node, p.reason) for p in placed]
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


def test_an_op_the_quantizer_leaves_float_says_so_u85():
    """A quantized model's op that no quantization rule takes (a 3-D convolution) stays on the CPU saying so, not
    telling the user to quantize the model they quantized."""
    model = nn.Sequential(nn.Conv3d(2, 4, 1), nn.Flatten(), nn.Linear(4 * 2 * 3 * 3, 8)).eval()
    compiled = compile(model, _inputs(1, 2, 2, 3, 3), "ethos-u85-256", quantize=True)
    placed = {p.node: p for p in compiled.edge.placements}
    assert placed["convolution"].placement == "cpu", placed["convolution"]
    assert "the quantizer has no rule for it" in placed["convolution"].reason
    assert "quantize the model" not in placed["convolution"].reason and compiled.edge.delegates


def test_set_io_config_applies_to_model_inputs_and_outputs():
    spec = EthosUCompileSpec("ethos-u55-128")
    io = get_symmetric_quantization_config(act_qmin=-127, act_qmax=127)
    gm = _quantize(EthosUQuantizer(spec).set_global(get_symmetric_quantization_config()).set_io(io),
                   Two(), _inputs(2, 8))
    qs = [n for n in gm.graph.nodes if is_quantize(n)]
    first = next(q for q in qs if q.args[0].op == "placeholder")
    last = qs[-1]
    assert first.args[3:5] == (-127, 127) and last.args[3:5] == (-127, 127)
    inner = [q for q in qs if q not in (first, last)]
    assert inner and all(q.args[3:5] == (-128, 127) for q in inner)


def test_additional_checks_keep_ops_on_the_cpu_with_their_reason():
    model, inputs = Two(), _inputs(2, 8)
    spec = EthosUCompileSpec("ethos-u85-256")
    quantized = _quantize(EthosUQuantizer(spec).set_global(get_symmetric_quantization_config()), model, inputs)
    cases = [
        (DontPartition(torch.ops.aten.relu.default), "relu", "excluded by DontPartition"),
        (DontPartitionName("linear_1"), "linear_1", "excluded by DontPartitionName('linear_1')"),
        (DontPartitionModule(instance_name="first"), "linear", "excluded by DontPartitionModule(instance_name='first')"),
        (DontPartitionModule(module_name="ReLU"), "relu", "excluded by DontPartitionModule(module_name='ReLU')"),
    ]
    for check, node, reason in cases:
        edge = to_edge_transform_and_lower(torch.export.export(quantized, inputs),
                                           partitioner=[EthosUPartitioner(spec, additional_checks=[check])])
        placed = {p.node: p for p in edge.placements}
        assert placed[node].placement == "cpu" and placed[node].reason == reason, placed[node]
        assert edge.delegates, "the rest is still delegated"


def test_cpu_op_names_its_source_line_or_module():
    """A CPU op's placement names where it comes from: the user's line (this file) when the model's forward
    made it, the module holding it when the model is all torch's own modules (an nn.Sequential), never a line
    inside torch."""
    spec = EthosUCompileSpec("ethos-u85-256")
    keep = [DontPartition(torch.ops.aten.relu.default)]
    sequential = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.ReLU())).eval()
    for model, where in ((Two(), f"{Path(__file__).name}:"), (sequential, "module 1.0 (ReLU)")):
        inputs = _inputs(2, 8)
        quantized = _quantize(EthosUQuantizer(spec).set_global(get_symmetric_quantization_config()), model, inputs)
        edge = to_edge_transform_and_lower(torch.export.export(quantized, inputs),
                                           partitioner=[EthosUPartitioner(spec, additional_checks=keep)])
        [relu] = [p for p in edge.placements if p.node.startswith("relu")]
        assert relu.placement == "cpu" and where in relu.source and "site-packages" not in relu.source, relu


def test_cpu_program_with_constants_runs_in_executorch(tmp_path, et_oracle):
    """No delegate: constants in the segment, memory-planned activations, portable kernels."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU6(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 5), nn.Softmax(-1)).eval()
    inputs = _inputs(1, 3, 12, 12)
    compiled = compile(model, inputs, "ethos-u55-128", quantize=False, delegate=False)
    assert compiled.program.emitted.constant_bytes > 0 and compiled.program.emitted.arena_bytes > 0
    path = tmp_path / "cpu.pte"
    compiled.program.save(path)
    [got] = et_oracle.run(path, inputs)
    with torch.no_grad():
        np.testing.assert_allclose(got, model(*inputs).numpy(), atol=1e-6, rtol=1e-5)


def test_quantized_cpu_program_runs_in_executorch(tmp_path, et_oracle):
    """Quantize/dequantize kernels and float ops on the CPU match the fake-quantized model."""
    model, inputs = Two(), _inputs(2, 8)
    compiled = compile(model, inputs, "ethos-u55-128", quantize=True, delegate=False)
    assert "quantized_decomposed::quantize_per_tensor.out" in compiled.program.emitted.kernel_ops
    path = tmp_path / "qcpu.pte"
    compiled.program.save(path)
    [got] = et_oracle.run(path, inputs)
    with torch.no_grad():
        np.testing.assert_allclose(got, compiled.quantized(*inputs).numpy(), atol=1e-5)
