"""The seeds' tutorial code runs with only its imports changed, and its results are right."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest
import torch

import tosakit
from tosakit.runtime import check_delegates, run_edge

pytestmark = pytest.mark.numerics

HERE = Path(__file__).parent / "tutorials"


def _run(script: str, tmp_path, monkeypatch) -> dict:
    monkeypatch.chdir(tmp_path)
    return runpy.run_path(str(HERE / script), run_name="__tutorial__")


def test_ethos_u_getting_started(tmp_path, monkeypatch, et_oracle):
    env = _run("ethos_u_getting_started.py", tmp_path, monkeypatch)
    pte = tmp_path / "ethos_u_minimal_example.pte"
    assert pte.is_file()
    assert et_oracle.load(pte) == ["forward"]
    edge = env["edge_program_manager"]
    [delegate] = edge.delegates
    assert delegate.backend_id == "EthosUBackend" and delegate.report.cpu_ops == 0
    # "built with an input of ones, so the expected result of the quantized addition should be close to 2"
    (out,) = run_edge(edge, torch.ones(1, 1, 1, 1), torch.ones(1, 1, 1, 1))
    assert abs(float(out) - 2.0) < 0.01
    assert all(c.passed for c in check_delegates(edge, env["example_inputs"]))


def test_vgf_getting_started(tmp_path, monkeypatch, et_oracle):
    env = _run("vgf_getting_started.py", tmp_path, monkeypatch)
    pte = tmp_path / "simple_example.pte"
    assert et_oracle.load(pte) == ["forward"]
    edge = env["edge_program_manager"]
    [delegate] = edge.delegates
    assert delegate.backend_id == "VgfBackend"
    blob = env["executorch_program_manager"].executorch_program.backend_delegate_data[0].data
    assert blob[:4] == b"VGF1"
    # set_module_type(Sigmoid, None): the sigmoid stays float inside the same delegate
    assert delegate.tosa_ops.get("SIGMOID") == 1 and delegate.tosa_ops.get("ADD") == 1
    x = torch.full((1, 1, 1, 1), 0.25)
    (out,) = run_edge(edge, x, x)
    assert abs(float(out) - float(torch.sigmoid(torch.tensor(0.5)))) < 0.01


def test_older_names_from_the_seeds(tmp_path, et_oracle):
    """ArmCompileSpecBuilder().ethosu_compile_spec(...).build(), generate_ethosu_compile_spec,
    ArmPartitioner and to_edge(...).to_backend(...) still work."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    spec = tosakit.ArmCompileSpecBuilder().ethosu_compile_spec(
        "ethos-u55-128",
        system_config="Ethos_U55_High_End_Embedded",
        memory_mode="Shared_Sram",
        extra_flags="--output-format=raw --debug-force-regor",
    ).build()
    assert isinstance(spec, tosakit.EthosUCompileSpec)
    assert spec.to_list() == tosakit.generate_ethosu_compile_spec(
        "ethos-u55-128", extra_flags=["--output-format=raw", "--debug-force-regor"]).to_list()

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
    example_inputs = (torch.randn(1, 3, 16, 16),)
    quantizer = tosakit.EthosUQuantizer(spec).set_global(tosakit.get_symmetric_quantization_config(False))
    gm = prepare_pt2e(torch.export.export(model, example_inputs).module(), quantizer)
    gm(*example_inputs)
    ep = torch.export.export(convert_pt2e(gm), example_inputs)
    edge = tosakit.to_edge(ep).to_backend(tosakit.ArmPartitioner(spec))
    assert [d.backend_id for d in edge.delegates] == ["EthosUBackend"]
    path = tmp_path / "mini.pte"
    edge.to_executorch().save(path)
    assert et_oracle.load(path) == ["forward"]
    assert all(c.passed for c in check_delegates(edge, example_inputs))
