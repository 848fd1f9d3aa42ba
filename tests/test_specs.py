"""Compile specs and targets: the values ExecuTorch's Arm runtime and tools expect (FORMATS.md)."""

from __future__ import annotations

import pytest

from tosakit import EthosUCompileSpec, TosaCompileSpec, TosakitError, TosaSpecification, VgfCompileSpec
from tosakit.specs import compile_spec_for_target


@pytest.mark.parametrize("target, tosa, system, memory", [
    ("ethos-u55-128", "TOSA-1.0+INT+int16+int4+u55", "Ethos_U55_High_End_Embedded", "Shared_Sram"),
    ("ethos-u65-256", "TOSA-1.0+INT+int16+int4+u55", "Ethos_U65_High_End", "Dedicated_Sram_384KB"),
    ("ethos-u85-256", "TOSA-1.0+INT+int16+int4+cf", "Ethos_U85_SYS_DRAM_Mid", "Sram_Only"),
])
def test_ethosu_defaults_and_stored_specs(target, tosa, system, memory):
    spec = EthosUCompileSpec(target, extra_flags=["--optimise", "Size"])
    stored = {c.key: c.value for c in spec.to_list()}
    assert list(stored) == ["tosa_spec", "compile_flags", "output_format", "target"]
    assert stored["tosa_spec"] == tosa.encode()
    assert stored["compile_flags"].decode() == (
        f"--optimise Size --accelerator-config={target} --config=Arm/vela.ini --output-format=raw "
        f"--system-config={system} --memory-mode={memory}")
    assert stored["output_format"] == b"vela" and stored["target"] == target.encode()
    assert spec.backend_id == "EthosUBackend"


def test_vgf_and_tosa_specs():
    vgf = {c.key: c.value for c in VgfCompileSpec().to_list()}
    assert vgf == {"tosa_spec": b"TOSA-1.0+FP+INT+int4+int16", "output_format": b"vgf"}
    assert VgfCompileSpec.backend_id == "VgfBackend"
    tosa = TosaCompileSpec("TOSA-1.0+INT")
    assert tosa.tosa_spec.support_integer() and not tosa.tosa_spec.support_float()
    assert TosaCompileSpec.backend_id == "TOSABackend"


def test_intermediates_path_is_stored():
    spec = EthosUCompileSpec("ethos-u55-128").dump_intermediate_artifacts_to("out/dir")
    assert spec.get_intermediate_path() == "out/dir"
    assert {c.key: c.value for c in spec.to_list()}["debug_artifact_path"] == b"out/dir"
    assert EthosUCompileSpec.get_output_format() == "vela" and VgfCompileSpec.get_output_format() == "vgf"


@pytest.mark.parametrize("text, words", [
    ("TOSA-0.80+BI", ["0.80", "TOSA-1.0"]),
    ("TOSA-1.0+INT+int99", ["int99", "extensions"]),
    ("TOSA-1.0", ["no profile"]),
    ("tosa", ["TOSA-1.0"]),
])
def test_bad_tosa_specs(text, words):
    with pytest.raises(TosakitError) as err:
        TosaSpecification.create_from_string(text)
    assert all(w in str(err.value) for w in words)


@pytest.mark.parametrize("kwargs, words", [
    (dict(target="ethos-u55-100"), ["ethos-u55-100", "ethos-u55-128"]),
    (dict(target="ethos-u55-128", system_config="Ethos_U85_SYS_DRAM_Mid"), ["not for ethos-u55-128"]),
    (dict(target="ethos-u55-128", memory_mode="Dedicated_Sram"), ["Ethos-U55", "Shared_Sram"]),
    (dict(target="ethos-u85-256", config_ini="no/such.ini"), ["no/such.ini", "not found"]),
])
def test_bad_ethosu_specs(kwargs, words):
    with pytest.raises(TosakitError) as err:
        EthosUCompileSpec(**kwargs)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_cli_target_names():
    assert isinstance(compile_spec_for_target("vgf"), VgfCompileSpec)
    assert str(compile_spec_for_target("TOSA-1.0+FP").tosa_spec) == "TOSA-1.0+FP"
    with pytest.raises(TosakitError, match="unknown target 'ethos'"):
        compile_spec_for_target("ethos")
