"""The wider zoo end to end: FP and INT TOSA against PyTorch, every compute op on the Ethos-U85,
and on the Ethos-U55 everything Vela's U55 support allows, each op left on the CPU explained."""

from __future__ import annotations

import pytest
import torch

from tosakit.capture import export
from tosakit.flow import partitioner_for, quantize_model
from tosakit.program import to_edge_transform_and_lower
from tosakit.runtime import evaluate_exact, run_edge
from tosakit.runtime.verify import Agreement, layer_reports
from tosakit.specs import EthosUCompileSpec, compile_spec_for_target
from tosakit.zoo import MODELS

pytestmark = pytest.mark.slow

ZOO = ["mv3", "resnet18", "transformer", "lstm", "unet", "audio1d"]
_cache: dict[str, tuple] = {}


def _model(name):
    if name not in _cache:
        model, inputs = MODELS[name].factory()
        quantized = quantize_model(model, inputs, EthosUCompileSpec("ethos-u85-256"))
        _cache[name] = (model.eval(), inputs, quantized)
    return _cache[name]


def _lower(name, target):
    _, inputs, quantized = _model(name)
    spec = compile_spec_for_target(target)
    return to_edge_transform_and_lower(export(quantized, inputs), partitioner=[partitioner_for(spec)])


def _cpu_compute(edge):
    return [p for p in edge.placements if p.placement == "cpu" and "quantize" not in p.target]


@pytest.mark.parametrize("name", ZOO)
def test_zoo_fp(harness, name):
    model, inputs, _ = _model(name)
    harness.fp(model, inputs)


@pytest.mark.parametrize("name", ZOO)
def test_zoo_int(name):
    """The INT TOSA against the fake-quantized model: every layer within one step of the fake-quantized
    layer fed the same values; end to end (where 1-step rounding ties grow through a deep random-weight
    network) far closer to the fake-quantized model than quantization is to float. (Not top-1: the classes
    of a random-weight network lie so close that which one wins depends on float summation order.)"""
    model, inputs, quantized = _model(name)
    edge = _lower(name, "TOSA-1.0+INT")
    assert not _cpu_compute(edge), _cpu_compute(edge)
    layers = layer_reports(edge, inputs, None)
    assert len(layers) > 10 and all(layer.matches for layer in layers), [
        (layer.node, layer.steps_off, layer.rel_error) for layer in layers if not layer.matches]
    [got] = run_edge(edge, *inputs)
    [fake_quant] = evaluate_exact(quantized, *inputs)
    with torch.no_grad():
        [reference] = [model(*inputs)]
    lowering, quantization = Agreement.of(got, fake_quant), Agreement.of(fake_quant, reference)
    assert lowering.snr_db >= max(20.0, quantization.snr_db + 3), (lowering, quantization)


@pytest.mark.parametrize("name", ZOO)
def test_zoo_u85(name):
    edge = _lower(name, "ethos-u85-256")
    assert not _cpu_compute(edge), [f"{p.node}: {p.reason}" for p in _cpu_compute(edge)]
    assert all(d.report.cpu_ops == 0 for d in edge.delegates)


@pytest.mark.parametrize("name", ZOO)
def test_zoo_u55(name):
    """Everything the U55 can take is delegated; whatever stays on the CPU says why."""
    edge = _lower(name, "ethos-u55-128")
    assert edge.delegates and all(d.report.cpu_ops == 0 for d in edge.delegates)
    for p in _cpu_compute(edge):
        assert p.reason and ("Ethos-U55" in p.reason or "U55" in p.reason or "Vela" in p.reason
                             or "runs fused" in p.reason), f"{p.node}: {p.reason}"
