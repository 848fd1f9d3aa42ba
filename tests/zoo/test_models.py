"""MobileNetV2 end to end: FP and INT TOSA against PyTorch, Vela for U55 and U85, VGF, real payloads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tosakit.backends.ethosu import parse_payload
from tosakit.capture import export
from tosakit.flow import compile, partitioner_for, quantize_model
from tosakit.program import to_edge_transform_and_lower
from tosakit.program.pte import deserialize_pte
from tosakit.runtime import check_delegates, evaluate_exact, run_edge
from tosakit.specs import EthosUCompileSpec, compile_spec_for_target
from tosakit.zoo.mobilenet_v2 import build

pytestmark = [pytest.mark.slow, pytest.mark.numerics]


@pytest.fixture(scope="module")
def mv2():
    return build()


@pytest.fixture(scope="module")
def mv2_quantized(mv2):
    """Quantized once (Ethos-U config: int8, per-channel weights), lowered for every target below."""
    model, inputs = mv2
    return quantize_model(model, inputs, EthosUCompileSpec("ethos-u55-128"))


def _lower(quantized, inputs, target, tmp_path=None):
    spec = compile_spec_for_target(target)
    if tmp_path is not None:
        spec.dump_intermediate_artifacts_to(str(tmp_path / "inter"))
    edge = to_edge_transform_and_lower(export(quantized, inputs), partitioner=[partitioner_for(spec)])
    return edge, edge.to_executorch()


def test_mv2_fp(harness, mv2):
    model, inputs = mv2
    harness.fp(model, inputs)


def test_mv2_int(harness, mv2, mv2_quantized):
    """The integer TOSA against the fake-quantized model evaluated exactly (float64, rounding only where it
    quantizes): bit for bit, the delegate and the whole program, so any wrong layer or wiring fails. (Not
    top-k of the float32 fake-quantized model: on random weights the classes lie so close that a one-step
    rounding tie, decided by float summation order, can reorder them.)"""
    _, inputs = mv2
    edge, _ = _lower(mv2_quantized, inputs, "TOSA-1.0+INT")
    harness.assert_delegated(type("C", (), {"edge": edge})())
    [check] = check_delegates(edge, inputs)
    assert check.integer and check.max_abs_error == 0, check
    (out,) = run_edge(edge, *inputs)
    assert torch.equal(out, evaluate_exact(mv2_quantized, *inputs)[0])


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_mv2_ethosu(mv2, mv2_quantized, target, tmp_path, et_oracle):
    _, inputs = mv2
    edge, program = _lower(mv2_quantized, inputs, target, tmp_path)
    [delegate] = edge.delegates
    cpu = [p for p in edge.placements if p.placement == "cpu"]
    assert [p.target for p in cpu] == ["quantized_decomposed.quantize_per_tensor.default",
                                       "quantized_decomposed.dequantize_per_tensor.default"]
    report = delegate.report
    assert report.cpu_ops == 0 and report.npu_ops > 20
    assert 2e6 < report.total_cycles < 2e7 and report.mac_count > 2.9e8
    assert 1024 * 1024 < report.sram_used_bytes < 4 * 1024 * 1024
    path = tmp_path / f"mv2_{target}.pte"
    program.save(path)
    assert et_oracle.load(path) == ["forward"]
    [check] = check_delegates(edge, inputs)
    assert check.max_abs_error == 0, check


def test_mv2_vgf(mv2, mv2_quantized, tmp_path, et_oracle):
    _, inputs = mv2
    edge, program = _lower(mv2_quantized, inputs, "vgf")
    [delegate] = edge.delegates
    assert delegate.backend_id == "VgfBackend"
    blob = program.executorch_program.backend_delegate_data[0].data
    assert blob[:4] == b"VGF1"
    path = tmp_path / "mv2_vgf.pte"
    program.save(path)
    assert et_oracle.load(path) == ["forward"]


def test_ethosu_payload_matches_vela_raw_output(mv2, mv2_quantized, tmp_path):
    """Parse the delegate back out of the .pte; blocks, order, padding and I/O table against
    FORMATS.md and against what the vela command line writes for the same TOSA and flags."""
    _, inputs = mv2
    _, program = _lower(mv2_quantized, inputs, "ethos-u55-128", tmp_path)
    prog, _ = deserialize_pte(program.buffer)
    [delegate] = prog.execution_plan[0].delegates
    assert delegate.id == "EthosUBackend"
    specs = {c.key: c.value.decode() for c in delegate.compile_specs}
    assert specs["tosa_spec"] == "TOSA-1.0+INT+int16+int4+u55" and specs["output_format"] == "vela"
    blob = prog.backend_delegate_data[delegate.processed.index].data
    payload = parse_payload(blob)
    assert [b for b, _ in payload.blocks] == ["vela_bin_stream", "cmd_data", "weight_data", "scratch_size",
                                               "inputs", "outputs", "vela_end_stream"]
    offset = 0
    for name, size in payload.blocks:  # 32-byte header, data padded to 16
        assert blob[offset:offset + 16].rstrip(b"\0").decode() == name
        offset += 32 + -(-size // 16) * 16
    assert offset == len(blob)
    # the runtime copies I/O by element count (Vela names the shape its first op reads: the image's 3 x 50176
    # swap when the NCHW -> NHWC TRANSPOSE runs as a block swap)
    assert np.prod(payload.inputs[0].shape) == 3 * 224 * 224 and payload.inputs[0].elem_size == 1
    assert payload.outputs[0].shape == (1, 1, 1, 1, 1, 1000)

    tosa = tmp_path / "inter" / "lowered_module_0.tosa"
    flags = specs["compile_flags"].split()
    out_dir = tmp_path / "vela_cli"
    vela = str(Path(sys.executable).parent / "vela")
    done = subprocess.run([vela, *flags, f"--output-dir={out_dir}", str(tosa)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    raw = np.load(out_dir / "lowered_module_0_vela.npz", allow_pickle=False)
    assert payload.cmd_data == raw["cmd_data"].item()
    assert payload.weight_data == raw["weight_data"].item()
    assert payload.scratch_size == int(raw["scratch_size"])
    for kind, tensors in (("input", payload.inputs), ("output", payload.outputs)):
        assert [t.shape for t in tensors] == [tuple(s) for s in raw[f"{kind}_shape"].tolist()]
        assert [t.elem_size for t in tensors] == raw[f"{kind}_elem_size"].tolist()
        assert [t.offset for t in tensors] == raw[f"{kind}_offset"].tolist()
        assert [t.region for t in tensors] == raw[f"{kind}_region"].tolist()


def test_float_mv2_on_ethosu_is_refused_before_lowering(mv2):
    """An unquantized MobileNetV2 delegated to an Ethos-U: one error naming the first float node and the
    ways out, before anything is lowered."""
    from tosakit.errors import TosakitError

    model, inputs = mv2
    with pytest.raises(TosakitError) as err:
        compile(model, inputs, "ethos-u55-128", quantize=False)
    message = str(err.value)
    assert "node convolution (aten.convolution.default" in message and "not quantized" in message
    assert "get_symmetric_a16w8_quantization_config" in message and "without --delegate" in message
