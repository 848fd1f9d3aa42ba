"""Ethos-U command streams (U55/U65 and U85): the register tables, the decoder and the disassembler, against
regor's own listing (``--verbose-register-command-stream``) of the built-in models, line for line."""

from __future__ import annotations

import contextlib
import functools
import io
import re
import struct

import pytest

from tosakit.backends.ethosu.payload import parse_payload
from tosakit.backends.ethosu.vela import compile_tosa
from tosakit.cli import main
from tosakit.errors import TosakitError
from tosakit.runtime import load
from tosakit.runtime.ethosu import npu
from tosakit.runtime.ethosu.commands import NotSimulatedError, decode, disassemble
from tosakit.runtime.ethosu.featuremap import Registers
from tosakit.runtime.ethosu.registers import U55, U85, Register, register_map
from tosakit.runtime.ethosu.simulate import require_simulated
from tosakit.specs import EthosUCompileSpec

ACCELERATORS = ("ethos-u55-128", "ethos-u65-256", "ethos-u85-128", "ethos-u85-256", "ethos-u85-512", "ethos-u85-2048")
U55_128_CONFIG, ARCH_1_0_6 = 0x00001807, 0x10066001  # what Vela writes for ethos-u55-128
U85_256_CONFIG = 0x20000118  # what Vela writes for ethos-u85-256
ARCH = {"ethos-u55": (1, 0, 6), "ethos-u65": (1, 0, 6), "ethos-u85": (2, 0, 0)}
MAPS = {"U55": U55, "U85": U85}
NOP = 0x00000005
STOP = 0xFFFF0000  # NPU_OP_STOP, mask 0xffff


# ------------------------------------------------------------------ regor's listing of the built-in models


@functools.cache
def _delegate_tosa(model_name: str, family: str) -> tuple[bytes, ...]:
    """The TOSA of each Ethos-U delegate of a built-in model, int8, partitioned for ``family`` (its
    smallest configuration)."""
    from tosakit.flow import compile
    from tosakit.program import LoweredBackendModule
    from tosakit.zoo import MODELS

    module, inputs = MODELS[model_name].factory()
    compiled = compile(module, inputs, {"ethos-u55": "ethos-u55-128", "ethos-u65": "ethos-u65-256",
                                        "ethos-u85": "ethos-u85-128"}[family], quantize=True)
    found = tuple(m.tosa for m in compiled.edge.program.graph_module.children()
                  if isinstance(m, LoweredBackendModule))
    assert found, f"{model_name}: nothing was delegated"
    return found


def _regor(tosa: bytes, accelerator: str) -> tuple[bytes, int, list[str]]:
    """Vela's cmd_data, and the length in words and the command lines of its register command stream listing."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        result = compile_tosa(tosa, EthosUCompileSpec(accelerator, extra_flags=["--verbose-register-command-stream"]))
    text = printed.getvalue()
    [words] = re.findall(r"^Register command stream: (\d+) words$", text, re.M)
    return result.cmd_data, int(words), [ln for ln in text.splitlines() if re.match(r"0x[0-9a-f]{6,}: ", ln)]


@pytest.mark.parametrize("accelerator", ACCELERATORS)
@pytest.mark.parametrize("model_name", ["digits", "waves", "audio1d", pytest.param("mv2", marks=pytest.mark.slow),
                                        pytest.param("transformer", marks=pytest.mark.slow),
                                        pytest.param("unet", marks=pytest.mark.slow)])
def test_disassembly_is_regors_listing(model_name, accelerator):
    family = accelerator.rsplit("-", 1)[0]
    for tosa in _delegate_tosa(model_name, family):
        cmd_data, words, listing = _regor(tosa, accelerator)
        stream = decode(cmd_data, accelerator)
        assert sum(2 if c.data is not None else 1 for c in stream.commands) == words
        assert stream.accelerator_config.accelerator == accelerator
        assert stream.accelerator_config.arch_version == ARCH[family]
        mine = disassemble(stream)
        for k, (got, want) in enumerate(zip(mine, listing)):
            assert got == want, f"line {k}:\n  ours:  {got}\n  regor: {want}"
        assert len(mine) == len(listing)
        assert stream.commands[-1].register.name == "NPU_OP_STOP"


# ------------------------------------------------------------------ the register table


def _encode(register: Register, values: dict[str, int]) -> list[int]:
    """The words of ``register`` with its fields set to ``values`` (a test-only encoder)."""
    value = 0
    for f in register.fields:
        assert 0 <= values[f.name] < 1 << f.width
        value |= values[f.name] << f.lsb
    if register.has_payload:
        return [(value >> 32) << 16 | register.code, value & 0xFFFFFFFF]
    assert value < 1 << 16
    return [value << 16 | register.code]


def _cmd_data(stream: list[int], length: int | None = None, fourcc: bytes = b"COP1",
              config: int = U55_128_CONFIG) -> bytes:
    """A COP1 driver payload around ``stream``, laid out as Vela lays it out."""
    length = len(stream) if length is None else length
    header = [0x00100001, config, ARCH_1_0_6, NOP, NOP, NOP, (length >> 16) << 8 | (length & 0xFFFF) << 16 | 0x02]
    return fourcc + struct.pack(f"<{len(header) + len(stream)}I", *header, *stream)


def test_the_table_has_every_vela_opcode():
    from ethosu.vela.ethos_u55_regs.ethos_u55_regs import cmd0, cmd1

    want = {op.value: op.name for op in cmd0} | {0x4000 | op.value: op.name for op in cmd1}
    assert {code: r.name for code, r in U55.items()} == want
    assert register_map("ethos-u65-256") is U55


def test_u85_table_differs_from_u55_where_regor_says():
    """Codes the U85 gives other meanings (and enum values it renumbers) are its own, not U55's."""
    assert register_map("ethos-u85-256") is U85
    moved = {0x4025: ("NPU_SET_OPA_SCALE", "NPU_SET_IFM_SCALE"), 0x4026: ("NPU_SET_OPB_SCALE", "NPU_SET_IFM2_SCALE"),
             0x012D: ("NPU_SET_AB_START", "NPU_SET_RESIZE_Y_OFFSET"),
             0x4033: ("NPU_SET_DMA0_SKIP0", "NPU_SET_DMA0_SRC_STRIDE0"),
             0x4092: ("NPU_SET_SCALE1_BASE", "NPU_SET_WEIGHT2_BASE")}
    for code, (u55, u85) in moved.items():
        assert (U55[code].name, U85[code].name) == (u55, u85)
    function = lambda table: next(f for f in table[0x0125].fields if f.name == "activation_function").enum  # noqa: E731
    assert function(U55)[4] == "ACTIVATION_FUNCTION_SIGMOID" and function(U85)[4] == "ACTIVATION_FUNCTION_LUT_S8_S8"
    assert {"NPU_OP_RESIZE", "NPU_SET_WEIGHT_FORMAT", "NPU_SET_OP_SCALAR", "NPU_OP_BRANCH"} <= \
        {r.name for r in U85.values()} - {r.name for r in U55.values()}


@pytest.mark.parametrize("table", MAPS)
def test_fields_fit_their_command_and_do_not_overlap(table):
    for register in MAPS[table].values():
        used = 0
        for f in register.fields:
            mask = ((1 << f.width) - 1) << f.lsb
            assert not used & mask, f"{register.name}.{f.name} overlaps another field"
            used |= mask
        assert used < 1 << (48 if register.has_payload else 16), register.name


def _values(register: Register, pick) -> dict[str, int]:
    return {f.name: pick(k, f) for k, f in enumerate(register.fields)}


def _valid(k: int, f) -> int:
    """A distinct, valid value for the k-th field: enum values in turn, other fields a bit pattern."""
    if f.enum is not None:
        keys = sorted(f.enum)
        return keys[(k + 1) % len(keys)]
    return (0x5A5A5A5A5A5A * (k + 1) + k) & ((1 << f.width) - 1)


def _top(f) -> int:
    return max(f.enum) if f.enum is not None else (1 << f.width) - 1


@pytest.mark.parametrize("table", MAPS)
def test_every_register_round_trips(table):
    config = {"U55": U55_128_CONFIG, "U85": U85_256_CONFIG}[table]
    for register in MAPS[table].values():
        cases = [_values(register, _valid)]
        cases += [_values(register, lambda k, f, one=one: _top(f) if f is one else 0) for one in register.fields]
        for values in cases:
            stream = decode(_cmd_data([*_encode(register, values), STOP], config=config))
            command = stream.commands[0]
            assert command.register is register
            assert command.fields == values, register.name
            assert all(command.field(name) == v for name, v in values.items())
            assert [c.register.name for c in stream.commands] == [register.name, "NPU_OP_STOP"]


def test_field_names_the_register_when_absent():
    command = decode(_cmd_data([STOP])).commands[0]
    with pytest.raises(KeyError, match="NPU_OP_STOP has no field 'addr'"):
        command.field("addr")


def test_a_40_bit_address_is_one_field():
    words = [0x00AB4000, 0x12345678, STOP]  # NPU_SET_IFM_BASE0, address extension 0xab in the parameter
    stream = decode(_cmd_data(words))
    assert stream.commands[0].field("addr") == 0xAB12345678
    assert disassemble(stream)[0] == ("0x000000: 12345678 00ab 4000 - NPU_SET_IFM_BASE0                171, "
                                      "addr = 0xab12345678")


# ------------------------------------------------------------------ hostile streams


def _fails(cmd_data: bytes, *fragments: str) -> None:
    with pytest.raises(TosakitError) as exc:
        decode(cmd_data)
    for fragment in fragments:
        assert fragment in exc.value.message, exc.value.message


def test_unknown_opcode_names_its_offset():
    _fails(_cmd_data([0x0001010F, 0x00000004, STOP]), "offset 0x000004", "unknown command code 0x0004")


def test_cmd1_without_its_data_word_names_its_offset():
    _fails(_cmd_data([0x0001010F, 0x00004000]), "offset 0x000004", "NPU_SET_IFM_BASE0 lacks its data word")


def test_stream_longer_than_the_data_names_the_header_offset():
    _fails(_cmd_data([0x0001010F, STOP], length=3), "byte 0x1c", "3 words", "holds 2")
    _fails(_cmd_data([STOP], length=1 << 23), "byte 0x1c")  # the length's high byte, in the reserved field


def test_bad_fourcc_names_its_offset():
    _fails(_cmd_data([STOP], fourcc=b"COP9"), "byte 0x0", "b'COP9'")
    _fails(b"COP1\x01\x00", "6 bytes")


def test_field_value_without_enum_name_names_its_offset():
    activation_function_1 = 0x00010125  # NPU_SET_ACTIVATION, activation_function = 1: no such function
    _fails(_cmd_data([STOP, activation_function_1, STOP]), "offset 0x000004",
           "NPU_SET_ACTIVATION field activation_function = 1")


def test_header_faults():
    _fails(b"COP1" + struct.pack("<2I", 0x00100001, U55_128_CONFIG), "byte 0x4", "lacks its config and id words")
    _fails(b"COP1" + struct.pack("<I", 0x03), "byte 0x4", "driver action 3")
    _fails(_cmd_data([STOP])[:-8], "no command stream")
    _fails(_cmd_data([STOP], config=0x00001800 | 15), "32768 MACs per cycle")
    with pytest.raises(TosakitError, match="compiled for ethos-u55-128, not ethos-u65-256"):
        decode(_cmd_data([STOP]), "ethos-u65-256")


def test_a_misspelt_register_or_field_fails_loudly_an_unset_one_reads_its_reset_value():
    """The simulator reads registers by name: a name this NPU does not have is a KeyError naming it (a typo never
    reads as 0); a register the stream did not set reads its reset value, 0 (and its enum name for 0)."""
    regs = Registers(U55)
    regs.set(decode(_cmd_data([0x00030113, STOP])).commands[0])  # NPU_SET_OFM_DEPTH_M1 = 3
    assert regs.value("NPU_SET_OFM_DEPTH_M1", "depth_m1") == 3
    assert regs.value("NPU_SET_OFM_HEIGHT_M1", "height_m1") == 0
    assert regs.name("NPU_SET_OFM_PRECISION", "activation_precision") == "ACTIVATION_PRECISION_B8"
    with pytest.raises(KeyError, match="NPU_SET_OFM_DEPHT_M1"):
        regs.value("NPU_SET_OFM_DEPHT_M1", "depth_m1")
    with pytest.raises(KeyError, match="NPU_SET_OFM_DEPTH_M1 has no field 'depth'"):
        regs.value("NPU_SET_OFM_DEPTH_M1", "depth")
    with pytest.raises(KeyError, match="NPU_SET_OFM_HEIGHT_M1 has no field 'height'"):
        regs.value("NPU_SET_OFM_HEIGHT_M1", "height")  # not set, misspelt all the same
    with pytest.raises(KeyError, match="activation_presicion"):
        regs.name("NPU_SET_OFM_PRECISION", "activation_presicion")
    with pytest.raises(KeyError, match="NPU_SET_IFM_SCALE"):
        regs.value("NPU_SET_IFM_SCALE", "scale")  # an Ethos-U85 register: the U55 has none


def test_what_the_executors_declare_they_run_on_u85_names_real_registers():
    """Each executor's declaration of what it runs on Ethos-U85 names a field of a U85 command and values it can
    hold; every operation command but NPU_OP_BRANCH has an executor."""
    by_name = {r.name: r for r in U85.values()}
    for (register, field), values in npu.U85_RUNS.items():
        (f,) = [f for f in by_name[register].fields if f.name == field]
        assert values and values <= (set(f.enum.values()) if f.enum else set(range(1 << f.width))), (register, field)
    assert {r for r in by_name if r.startswith("NPU_OP_")} - set(npu.OPERATIONS) == {"NPU_OP_BRANCH"}


def test_u85_streams_decode_and_what_is_not_run_yet_is_named():
    stream = decode(_cmd_data([STOP], config=U85_256_CONFIG))
    assert stream.accelerator_config.accelerator == "ethos-u85-256" and stream.accelerator_config.shram_kib is None
    assert require_simulated(stream) is stream
    replicate = 0x00010007  # NPU_OP_RESIZE, REPLICATE (Vela's mode for what is neither bilinear nor nearest)
    with pytest.raises(NotSimulatedError, match=r"an Ethos-U85 command stream \(ethos-u85-256\) the simulator does "
                                                r"not run yet: the command at offset 0x000004 \(NPU_OP_RESIZE "
                                                r"resize_mode = RESIZE_MODE_REPLICATE\)"):
        require_simulated(decode(_cmd_data([STOP, replicate, STOP], config=U85_256_CONFIG)))
    branch = [0x00004100, 0]  # NPU_OP_BRANCH
    with pytest.raises(NotSimulatedError, match=r"offset 0x000000 \(NPU_OP_BRANCH\)"):
        require_simulated(decode(_cmd_data([*branch, STOP], config=U85_256_CONFIG)))
    assert require_simulated(decode(_cmd_data([STOP]))).commands[0].register.name == "NPU_OP_STOP"
    with pytest.raises(TosakitError, match="unknown Ethos-U accelerator"):
        register_map("ethos-u56-128")


@pytest.mark.parametrize("table", MAPS)
def test_damaged_streams_fail_cleanly(table):
    """Every truncation and single-word corruption of a stream of all commands decodes or raises TosakitError."""
    stream = [w for r in MAPS[table].values() for w in _encode(r, _values(r, _valid))] + [STOP]
    good = _cmd_data(stream, config={"U55": U55_128_CONFIG, "U85": U85_256_CONFIG}[table])
    assert len(decode(good).commands) == len(MAPS[table]) + 1
    damaged = [good[:n] for n in range(0, len(good), 4)]
    damaged += [good[:n] + bytes([good[n] ^ bit]) + good[n + 1:] for n in range(0, len(good), 3) for bit in (1, 0x80)]
    for cmd_data in damaged:
        with contextlib.suppress(TosakitError):
            decode(cmd_data)


# ------------------------------------------------------------------ tosakit inspect --commands


def test_inspect_lists_the_command_stream(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "-q", "-m", "add", "--delegate", "--quantize", "-o", "add.pte"]) == 0
    capsys.readouterr()
    assert main(["inspect", "add.pte"]) == 0
    plain = capsys.readouterr().out
    assert "delegate 0: EthosUBackend" in plain and "NPU_OP" not in plain
    assert main(["inspect", "--commands", "add.pte"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(plain)
    listing = out[len(plain):].splitlines()
    assert re.fullmatch(r"method forward, delegate 0 \(EthosUBackend\): ethos-u55-128 command stream, \d+ commands "
                        r"in \d+ words \(SHRAM 24 KiB, architecture 1\.0\.6\)", listing[0])
    program = load(tmp_path / "add.pte")
    [delegate] = program.program.execution_plan[0].delegates
    assert listing[1:] == disassemble(decode(parse_payload(program.delegate_payload(delegate)).cmd_data))
    assert "NPU_OP_ELEMENTWISE" in out and listing[-1].split(" - ")[1].startswith("NPU_OP_STOP")


def test_inspect_lists_an_ethos_u85_command_stream(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "-q", "-m", "add", "-t", "ethos-u85-256", "--delegate", "--quantize", "-o", "add.pte"]) == 0
    capsys.readouterr()
    assert main(["inspect", "--commands", "add.pte"]) == 0
    listing = capsys.readouterr().out.split("method forward, delegate 0")[1].splitlines()
    assert re.fullmatch(r" \(EthosUBackend\): ethos-u85-256 command stream, \d+ commands in \d+ words "
                        r"\(architecture 2\.0\.0\)", listing[0])
    program = load(tmp_path / "add.pte")
    [delegate] = program.program.execution_plan[0].delegates
    assert listing[1:] == disassemble(decode(parse_payload(program.delegate_payload(delegate)).cmd_data))
    assert any("elementwise_mode = ELEMENTWISE_MODE_ADD" in ln for ln in listing)
    assert listing[-1].split(" - ")[1].startswith("NPU_OP_STOP")
