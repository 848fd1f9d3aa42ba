"""The VGF engine: a VgfBackend delegate's payload executed by Arm's ML SDK stack in a child process, checked
against the TOSA it was converted from; its container checked before the stack sees it; a machine without the
stack told what it lacks."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from tosakit.cli import main
from tosakit.errors import TosakitError
from tosakit.flow import compile
from tosakit.runtime import LoadedProgram
from tosakit.runtime.vgf import container, stack
from tosakit.runtime.vgf.container import parse_vgf
from tosakit.specs import VgfCompileSpec
from tosakit.zoo import MODELS

pytestmark = pytest.mark.numerics


def _programs(name: str, quantize: bool):
    """The built-in model compiled for vgf with its TOSA carried, and without (as a user compiles it)."""
    model, inputs = MODELS[name].factory()
    kw = {"quantize": quantize, "calibration": [inputs]} if quantize else {}
    carried = compile(model, inputs, VgfCompileSpec().with_debug_info(), **kw)
    plain = compile(model, inputs, VgfCompileSpec(), **kw)
    return carried, plain, inputs


# The built-in models tests/zoo/test_zoo.py leaves out (it runs the others' VGF payloads, from their TOSA profiles).
OUTSIDE_THE_ZOO_TEST = ["add", "add3", "softmax", "mv2", "digits", "waves"]


@pytest.mark.parametrize("name", OUTSIDE_THE_ZOO_TEST)
def test_builtin_models_run_their_vgf_payload_int(vgf_stack, name):
    """Each quantized model's VGF delegates run on the stack bit-exactly with their TOSA on the reference model;
    compiled without --debug-info (no TOSA inside) the program runs too, to the same outputs."""
    carried, plain, inputs = _programs(name, quantize=name != "add")
    with_tosa = LoadedProgram(carried.program.buffer, f"{name}.pte")
    got, comparisons = with_tosa.run_and_compare(list(inputs))
    assert comparisons and all(c.bit_exact for c in comparisons), [str(c) for c in comparisons]
    alone = LoadedProgram(plain.program.buffer, f"{name}.pte")
    assert alone.layouts["forward"].delegate_vgf and not alone.layouts["forward"].delegate_tosa
    assert all(torch.equal(a, b) for a, b in zip(alone.run(list(inputs)), got))


@pytest.mark.parametrize("name", [n for n in OUTSIDE_THE_ZOO_TEST if n != "add"])  # add: int32, no float
def test_builtin_models_run_their_vgf_payload_fp(vgf_stack, name):
    """Float VGF delegates agree with their TOSA on the reference model within ExecuTorch's VGF tolerance."""
    carried, _, inputs = _programs(name, quantize=False)
    _, comparisons = LoadedProgram(carried.program.buffer, f"{name}.pte").run_and_compare(list(inputs))
    assert comparisons and all(c.max_abs_diff <= 1e-3 for c in comparisons), [str(c) for c in comparisons]


def test_run_names_the_vgf_engine_and_compile_verify_checks_the_payload(vgf_stack, tmp_path, capsys):
    """`tosakit run` says the VGF delegate ran on the stack; `compile --verify` checks the payload it ran against
    the delegate's TOSA (it ran the TOSA only, and a file without --debug-info could not run)."""
    out = tmp_path / "mv3.pte"
    assert main(["compile", "-m", "ds_cnn", "-t", "vgf", "--delegate", "--quantize", "--verify", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "VGF payloads run on Arm's ML SDK (the vgf engine): 1 of 1 delegate output(s) bit-exact" in text, text
    assert main(["run", str(out), "--random"]) == 0
    assert "(1 VGF delegate(s) on Arm's ML SDK (vgf engine))" in capsys.readouterr().out


class PicksOne(torch.nn.Module):
    """where(x == 0.2523, x, y) on x in steps of 1/128: never equal, so the integer graph returns y and never reads x."""

    def forward(self, x, y):
        return torch.where(torch.eq(x, 0.2523), x, y)


def test_an_input_the_graph_never_reads_is_bound_by_position_int(vgf_stack):
    """The model converter drops an input the TOSA graph never reads and keeps the others' bindings: the VGF engine
    passes the call's inputs by binding (it took the dropped input's place: 'the VGF file has 1 inputs, the call
    passes 2')."""
    x = (torch.arange(-128, 128, dtype=torch.float32) / 128).reshape(2, 128)
    compiled = compile(PicksOne().eval(), (x, -x), VgfCompileSpec().with_debug_info(), quantize=True)
    program = LoadedProgram(compiled.program.buffer, "picks_one.pte")
    [got], comparisons = program.run_and_compare([x, -x])
    assert comparisons and all(c.bit_exact for c in comparisons), [str(c) for c in comparisons]
    assert torch.allclose(got, -x, atol=0.01)


def _vgf_bytes() -> bytes:
    model, inputs = MODELS["add"].factory()
    return compile(model, inputs, "vgf").edge.program.graph_module.lowered_module_0.processed_bytes


def test_damaged_vgf_containers_are_refused_before_the_stack_sees_them():
    """The FourCC, the format version, each section inside the file and after the one before, the flatbuffer
    roots, the reserved header bytes: each fault named."""
    good = _vgf_bytes()
    parse_vgf(good)

    def patched(offset: int, fmt: str, value) -> bytes:
        data = bytearray(good)
        struct.pack_into(fmt, data, offset, value)
        return bytes(data)

    module_offset, _ = struct.unpack_from("<QQ", good, 16)
    cases = {
        "shorter than the 128-byte VGF header": good[:100],
        "not the VGF FourCC": b"VGF2" + good[4:],
        "VGF format version 9.5.0": patched(8, "<B", 9),
        "its module table spans bytes": patched(16, "<Q", len(good)),
        "its model resource table spans bytes": patched(48, "<Q", 16),
        "is not a flatbuffer": patched(module_offset, "<I", 1 << 30),
        "reserved bytes are not zero": patched(120, "<B", 1),
        "its constant section spans bytes": good[:-4],
    }
    for words, data in cases.items():
        with pytest.raises(TosakitError) as info:
            parse_vgf(data, "delegate 0")
        assert words in info.value.message and info.value.message.startswith("delegate 0: "), (words, info.value)
    assert container.HEADER_BYTES == 128


def test_without_the_stack_a_run_says_what_is_missing_and_falls_back_to_tosa(tmp_path, monkeypatch, capsys):
    """On a machine without the stack: a file carrying its TOSA runs it on the reference model; one without says
    which part is missing and how to add it; `--engine vgf` and `tosakit doctor` say the same."""
    model, inputs = MODELS["add"].factory()
    carried, plain = tmp_path / "carried.pte", tmp_path / "plain.pte"
    compile(model, inputs, VgfCompileSpec().with_debug_info()).program.save(carried)
    compile(model, inputs, "vgf").program.save(plain)
    monkeypatch.setattr(stack, "missing", lambda: [("the Vulkan loader (libvulkan.so.1)", "apt-get install libvulkan1")])
    assert main(["run", str(carried), "--random"]) == 0
    assert "(1 delegate(s) on the TOSA reference model)" in capsys.readouterr().out
    assert main(["run", str(plain), "--random"]) == 2
    err = capsys.readouterr().err
    assert "lacks the VGF engine's the Vulkan loader (libvulkan.so.1)" in err and "apt-get install libvulkan1" in err
    assert main(["run", str(carried), "--random", "--engine", "vgf"]) == 2
    assert "cannot execute VGF files: it lacks the Vulkan loader" in capsys.readouterr().err
    assert main(["doctor", "--quick"]) == 2
    assert "vgf   MISSING" in capsys.readouterr().out


def test_a_damaged_payload_the_container_check_passes_ends_in_an_error_line(vgf_stack, tmp_path, capsys):
    """Bytes flipped inside the VGF's sections (past the container check) reach the stack in its child process:
    each run ends in exit 0 or an `error:` line with exit 2, never a crash of this process or a hang."""
    from tosakit.program.pte import deserialize_pte, serialize_pte

    model, inputs = MODELS["add"].factory()
    buffer = compile(model, inputs, "vgf").program.buffer
    program, segments = deserialize_pte(buffer)
    blob = program.backend_delegate_data[0].data
    start = container.HEADER_BYTES
    rng = np.random.default_rng(0)
    for k in range(12):
        data = bytearray(blob)
        for at in rng.integers(start, len(data), 4):
            data[at] ^= 1 << int(rng.integers(0, 8))
        program.backend_delegate_data[0].data = bytes(data)
        path = tmp_path / f"damaged{k}.pte"
        path.write_bytes(serialize_pte(program, segments))
        code = main(["run", str(path), "--random", "--timeout", "20"])
        err = capsys.readouterr().err
        assert code in (0, 2) and "Traceback" not in err, (k, code, err)
        assert code == 0 or err.startswith("error: "), err
