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


def test_typed_vela_options_store_the_flags_and_give_the_options_they_read_as():
    """optimise and arena_cache_size are typed on the spec; the .pte stores them as the flags the CLI glued
    before, and Vela reads the spec as it reads those stored flags."""
    from tosakit.backends.ethosu.vela_options import parse_vela_flags, vela_options

    spec = EthosUCompileSpec("ethos-u55-128", extra_flags="--verbose-allocation --optimise=Performance",
                             optimise="Size", arena_cache_size=4096)
    stored = {c.key: c.value for c in spec.to_list()}["compile_flags"].decode()
    assert stored.startswith("--verbose-allocation --optimise=Performance --optimise=Size --arena-cache-size=4096 "
                             "--accelerator-config=ethos-u55-128 ")
    assert vela_options(spec) == parse_vela_flags(spec.compiler_flags)
    assert (vela_options(spec).optimise, vela_options(spec).arena_cache_size) == ("Size", 4096)
    with pytest.raises(TosakitError, match="invalid value 'Fast' for Vela flag --optimise"):
        EthosUCompileSpec("ethos-u55-128", optimise="Fast")
    with pytest.raises(TosakitError, match="only apply to Ethos-U targets"):
        compile_spec_for_target("vgf", optimise="Size")


def test_targets_are_parsed_once_into_records():
    from tosakit.targets import ETHOSU_TARGETS, parse_target

    u65 = parse_target(" Ethos-U65-512 ")
    assert (u65.family, u65.macs, u65.cores, u65.macs_per_core, u65.product) == ("u65", 512, 2, 256, "ethos-u65")
    assert EthosUCompileSpec("ethos-u85-256").npu is ETHOSU_TARGETS["ethos-u85-256"]
    assert parse_target("vgf").tosa == str(VgfCompileSpec().tosa_spec)
    assert parse_target("TOSA-1.0+FP").tosa == "TOSA-1.0+FP"
    with pytest.raises(TosakitError, match="unknown target 'ethos-u99'"):
        parse_target("ethos-u99")
