"""Ethos-U compiler step: Vela (regor) in process, and the delegate payload.

The graphs are small INT8 TOSA 1.0 networks built with tosa_serializer. Every
compilation is checked against what the ``vela`` command line writes for the
same .tosa file and flags.
"""

from __future__ import annotations

import re
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tosa_serializer as ts

from tosakit.backends.ethosu import vela as vela_backend
from tosakit.backends.ethosu.payload import BLOCK_ORDER, pack_payload, parse_payload
from tosakit.backends.ethosu.vela import VelaTensor, compile_tosa
from tosakit.backends.ethosu.vela_options import parse_vela_flags
from tosakit.errors import TosakitError
from tosakit.specs import EthosUCompileSpec

pytestmark = pytest.mark.numerics

SHAPE = [1, 16, 16, 8]
CONV_OUT_CHANNELS = 16
_NUMPY_TYPES = {ts.DType.INT8: np.int8, ts.DType.INT32: np.int32}

# ------------------------------------------------------------------ TOSA graphs


def _serializer():
    return ts.TosaSerializer("", targetMajor=1, targetMinor=0, targetPatch=0, targetDraft=False)


def _const(ser, dtype, values):
    array = np.asarray(values, dtype=_NUMPY_TYPES[dtype])
    return ser.addConst(list(array.shape), dtype, array)


def _rescale(ser, src, dst, in_dtype, out_dtype, shift, in_zp, out_zp):
    inputs = [src.name, _const(ser, ts.DType.INT32, [1 << 30]).name, _const(ser, ts.DType.INT8, [shift]).name,
              _const(ser, in_dtype, [in_zp]).name, _const(ser, out_dtype, [out_zp]).name]
    attr = ts.TosaSerializerAttribute()
    attr.RescaleAttribute(True, ts.RoundingMode.SINGLE_ROUND, False, False, False)
    ser.addOperator(ts.Op.RESCALE, inputs, [dst.name], attr)


def add_graph() -> bytes:
    """int8 x, y -> RESCALE to int32 each -> ADD -> RESCALE to int8."""
    ser = _serializer()
    x, y = ser.addPlaceholder(SHAPE, ts.DType.INT8), ser.addPlaceholder(SHAPE, ts.DType.INT8)
    x32, y32, total = (ser.addIntermediate(SHAPE, ts.DType.INT32) for _ in range(3))
    _rescale(ser, x, x32, ts.DType.INT8, ts.DType.INT32, 30, 3, 0)
    _rescale(ser, y, y32, ts.DType.INT8, ts.DType.INT32, 30, -2, 0)
    attr = ts.TosaSerializerAttribute()
    attr.AddAttribute()
    ser.addOperator(ts.Op.ADD, [x32.name, y32.name], [total.name], attr)
    out = ser.addOutput(SHAPE, ts.DType.INT8)
    _rescale(ser, total, out, ts.DType.INT32, ts.DType.INT8, 31, 0, 5)
    return ser.serialize()


def conv_graph() -> bytes:
    """int8 CONV2D 3x3 (bias, zero points) -> RESCALE -> CLAMP."""
    ser = _serializer()
    rng = np.random.default_rng(0)
    out_shape = [*SHAPE[:3], CONV_OUT_CHANNELS]
    x = ser.addPlaceholder(SHAPE, ts.DType.INT8)
    weights = _const(ser, ts.DType.INT8, rng.integers(-127, 128, (CONV_OUT_CHANNELS, 3, 3, SHAPE[3])))
    bias = _const(ser, ts.DType.INT32, rng.integers(-1000, 1000, (CONV_OUT_CHANNELS,)))
    input_zp, weight_zp = _const(ser, ts.DType.INT8, [-1]), _const(ser, ts.DType.INT8, [0])
    acc = ser.addIntermediate(out_shape, ts.DType.INT32)
    attr = ts.TosaSerializerAttribute()
    attr.Conv2dAttribute([1, 1, 1, 1], [1, 1], [1, 1], False, ts.DType.INT32)
    ser.addOperator(ts.Op.CONV2D, [x.name, weights.name, bias.name, input_zp.name, weight_zp.name], [acc.name], attr)
    scaled = ser.addIntermediate(out_shape, ts.DType.INT8)
    _rescale(ser, acc, scaled, ts.DType.INT32, ts.DType.INT8, 40, 0, -128)
    out = ser.addOutput(out_shape, ts.DType.INT8)
    clamp = ts.TosaSerializerAttribute()
    clamp.ClampAttribute([(-100) & 0xFF], [100], ts.NanPropagationMode.PROPAGATE)
    ser.addOperator(ts.Op.CLAMP, [scaled.name], [out.name], clamp)
    return ser.serialize()


def binary_graph(op, attribute: str, dtype, *attr_args) -> bytes:
    """A single elementwise operator on two inputs of ``dtype``."""
    ser = _serializer()
    a, b = ser.addPlaceholder([1, 4, 4, 8], dtype), ser.addPlaceholder([1, 4, 4, 8], dtype)
    out = ser.addOutput([1, 4, 4, 8], dtype)
    attr = ts.TosaSerializerAttribute()
    getattr(attr, attribute)(*attr_args)
    ser.addOperator(op, [a.name, b.name], [out.name], attr)
    return ser.serialize()


GRAPHS = {"add": add_graph(), "conv": conv_graph()}
# (graph, expected input shapes, expected output shapes), Vela's 6-dim form
GRAPH_IO = {
    "add": ([(1, 1, *SHAPE)] * 2, [(1, 1, *SHAPE)]),
    "conv": ([(1, 1, *SHAPE)], [(1, 1, *SHAPE[:3], CONV_OUT_CHANNELS)]),
}
TARGETS = ("ethos-u55-128", "ethos-u85-256")


@pytest.fixture(scope="module")
def compiled():
    """compile_tosa results for every graph and target, computed once."""
    return {(g, t): compile_tosa(GRAPHS[g], EthosUCompileSpec(t)) for g in GRAPHS for t in TARGETS}


# ------------------------------------------------------------------ the vela CLI

VELA_CLI = Path(sys.executable).with_name("vela")
PRINT_ONLY_FLAGS = ["--verbose-performance", "--verbose-weights", "--verbose-cycle-estimate"]


def run_vela_cli(tosa: bytes, flags: list[str], folder: Path) -> tuple[dict, str]:
    """Vela's own raw output (.npz contents) and printed text for the same graph and flags."""
    network = folder / "net.tosa"
    network.write_bytes(tosa)
    done = subprocess.run([str(VELA_CLI), *flags, *PRINT_ONLY_FLAGS, "--output-dir", str(folder), str(network)],
                          capture_output=True, text=True, check=True)
    fields = ["cmd_data", "weight_data", "scratch_size", "scratch_fast_size"]
    fields += [f"{io}_{part}" for io in ("input", "output") for part in ("shape", "elem_size", "offset", "region")]
    with np.load(folder / "net_vela.npz") as npz:  # the *_quantization entries are pickled: not loaded
        return {key: npz[key] for key in fields}, done.stdout


def npz_bytes(array: np.ndarray) -> bytes:
    """np.savez keeps bytes as a 0-d 'S<n>' array; b'' comes back as one NUL."""
    data = array.tobytes()
    return b"" if data == b"\0" else data


def npz_tensors(npz: dict, prefix: str) -> list[VelaTensor]:
    return [VelaTensor(tuple(int(d) for d in shape), int(size), int(offset), int(region))
            for shape, size, offset, region in zip(npz[f"{prefix}_shape"], npz[f"{prefix}_elem_size"],
                                                   npz[f"{prefix}_offset"], npz[f"{prefix}_region"])]


def cli_summary(text: str) -> dict:
    """The network-summary figures the vela CLI prints."""
    def number(pattern: str) -> float:
        return float(re.search(pattern, text).group(1))

    return {
        "clock_mhz": number(r"Accelerator clock\s+(\d+) MHz"),
        "memory_kib": {label: float(kib) for label, kib in re.findall(r"Total (.+?) used\s+([\d.]+) KiB", text)},
        "cpu_ops": number(r"CPU operators = (\d+)"),
        "npu_ops": number(r"NPU operators = (\d+)"),
        "macs": number(r"Neural network macs\s+(\d+)"),
        "npu_cycles": number(r"NPU cycles\s+(\d+)"),
        "total_cycles": number(r"Total cycles\s+(\d+)"),
        "weights_kib": (number(r"Original Weights Size\s+([\d.]+)"), number(r"NPU Encoded Weights Size\s+([\d.]+)")),
    }


def cli_per_layer(text: str) -> list[list[str]]:
    """Rows of the per-layer table --verbose-performance prints (one field per column)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Original Operator")) + 2
    rows = []
    for line in lines[start:]:
        if not line.strip():
            break
        rows.append(line.split())
    return rows


CLI_CASES = [
    ("add", "ethos-u55-128", []),
    ("conv", "ethos-u55-128", []),
    ("add", "ethos-u85-256", []),
    ("conv", "ethos-u85-256", []),
    ("conv", "ethos-u55-128", ["--optimise", "Size", "--cop-format=COP2"]),
    ("conv", "ethos-u65-512", ["--arena-cache-size=4096", "--disable-cascading", "--tensor-allocator", "Greedy"]),
]


@pytest.fixture(scope="module")
def with_vela_cli(tmp_path_factory):
    """(compile_tosa result, Vela's npz contents, Vela's printed text) per case, each computed once."""
    cache = {}

    def run(graph: str, target: str, extra: list[str]):
        key = (graph, target, tuple(extra))
        if key not in cache:
            spec = EthosUCompileSpec(target, extra_flags=extra)
            npz, printed = run_vela_cli(GRAPHS[graph], spec.compiler_flags, tmp_path_factory.mktemp("vela"))
            cache[key] = (compile_tosa(GRAPHS[graph], spec), npz, printed)
        return cache[key]

    return run


def _case_id(value) -> str:
    return " ".join(value) if isinstance(value, list) else value


@pytest.mark.parametrize("graph,target,extra", CLI_CASES, ids=_case_id)
def test_result_and_payload_match_vela_cli(with_vela_cli, graph, target, extra):
    result, npz, _ = with_vela_cli(graph, target, extra)

    assert result.cmd_data == npz_bytes(npz["cmd_data"])
    assert result.weight_data == npz_bytes(npz["weight_data"])
    assert result.scratch_size == int(npz["scratch_size"])
    assert result.fast_scratch_size == int(npz["scratch_fast_size"])
    assert result.inputs == npz_tensors(npz, "input")
    assert result.outputs == npz_tensors(npz, "output")

    payload = parse_payload(pack_payload(result))
    assert payload.cmd_data == npz_bytes(npz["cmd_data"])
    assert payload.weight_data == npz_bytes(npz["weight_data"])
    assert payload.scratch_size == int(npz["scratch_size"])
    assert (payload.inputs, payload.outputs) == (npz_tensors(npz, "input"), npz_tensors(npz, "output"))


@pytest.mark.parametrize("graph,target,extra", CLI_CASES, ids=_case_id)
def test_report_matches_vela_summary(with_vela_cli, graph, target, extra):
    result, _, printed = with_vela_cli(graph, target, extra)
    report = result.report
    cli = cli_summary(printed)

    assert report.clock_hz / 1e6 == cli["clock_mhz"]
    assert {label: round(used / 1024, 2) for label, used in report.memory_used.items()} == cli["memory_kib"]
    assert round(report.sram_used_bytes / 1024, 2) == cli["memory_kib"].get("SRAM", 0.0)
    offchip = cli["memory_kib"].get("Off-chip Flash", 0.0) + cli["memory_kib"].get("DRAM", 0.0)
    assert round(report.offchip_used_bytes / 1024, 2) == pytest.approx(offchip, abs=0.011)
    assert (report.cpu_ops, report.npu_ops) == (cli["cpu_ops"], cli["npu_ops"])
    assert (report.mac_count, report.npu_cycles, report.total_cycles) == (
        cli["macs"], cli["npu_cycles"], cli["total_cycles"])
    assert (round(report.weights_original_bytes / 1024, 2), round(report.weights_encoded_bytes / 1024, 2)) == \
        cli["weights_kib"]
    assert report.inference_time_s == pytest.approx(report.total_cycles / report.clock_hz)

    rows = cli_per_layer(printed)
    assert len(rows) == len(report.per_op)
    for op, row in zip(report.per_op, rows):
        assert (op.operator, op.npu_operator, "NPU" if op.on_npu else "CPU") == tuple(row[:3])
        assert (op.staging_bytes, op.cycles, op.npu_cycles, op.macs) == tuple(int(row[i]) for i in (3, 5, 7, 12))
        assert op.name == row[15]
        if op.cycles:
            assert round(op.mac_utilisation * 100, 2) == float(row[14])
        access = dict(zip(("SRAM", "DRAM", "On-chip Flash", "Off-chip Flash"), (int(row[i]) for i in range(8, 12))))
        memory = max(access, key=access.get)
        bound = memory if int(row[7]) < int(row[5]) and access[memory] > int(row[7]) else "NPU"
        assert op.bound_by == bound
    assert sum(report.bound_by.values()) == pytest.approx(1.0) or not report.total_cycles


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("graph", GRAPHS)
def test_io_and_command_stream(compiled, graph, target):
    result = compiled[graph, target]
    assert result.cmd_data[:4] in (b"COP1", b"COP2")
    inputs, outputs = GRAPH_IO[graph]
    assert [t.shape for t in result.inputs] == inputs
    assert [t.shape for t in result.outputs] == outputs
    for tensor in result.inputs + result.outputs:
        assert tensor.elem_size == 1  # int8
        assert tensor.region == 1  # the scratch arena
        assert tensor.offset + int(np.prod(tensor.shape)) <= result.scratch_size
    assert (len(result.weight_data) > 0) == (graph == "conv")


def test_per_op_names_the_tosa_operators(compiled):
    report = compiled["conv", "ethos-u55-128"].report
    conv = report.per_op[0]
    assert (conv.tosa_op, conv.operator) == ("CONV2D", "Conv2D")
    assert conv.macs == report.mac_count == 16 * 16 * CONV_OUT_CHANNELS * 3 * 3 * SHAPE[3]
    assert 0 < conv.mac_utilisation <= 1
    assert [op.tosa_op for op in report.per_op] == ["CONV2D", "CLAMP"]
    assert "SRAM used: 6.00 KiB" in report.summary()


def test_compile_is_silent_unless_verbose(capfd):
    compile_tosa(GRAPHS["add"], EthosUCompileSpec("ethos-u55-128"))
    assert capfd.readouterr().out == ""
    compile_tosa(GRAPHS["add"], EthosUCompileSpec("ethos-u55-128", extra_flags=["--verbose-schedule"]))
    assert "Schedule" in capfd.readouterr().out


# -------------------------------------------------------------------- payload


def _headers(blob: bytes) -> list[tuple[int, str, int, bytes]]:
    """(offset, name, size, raw header) of each block, walking the blob by the format rules."""
    found, offset = [], 0
    while offset < len(blob):
        raw = blob[offset:offset + 32]
        size = struct.unpack_from("<I", raw, 16)[0]
        found.append((offset, raw[:16].rstrip(b"\0").decode(), size, raw))
        offset += 32 + -(-size // 16) * 16
    assert offset == len(blob)
    return found


@pytest.mark.parametrize("graph", GRAPHS)
def test_payload_layout(compiled, graph):
    result = compiled[graph, "ethos-u85-256"]
    blob = pack_payload(result)
    headers = _headers(blob)
    assert [name for _, name, _, _ in headers] == list(BLOCK_ORDER)
    for offset, name, size, raw in headers:
        assert offset % 16 == 0
        assert raw[:16] == name.encode().ljust(16, b"\0")
        assert raw[20:32] == bytes(12)  # external flag and reserved bytes
        data_end = offset + 32 + size
        assert not any(blob[data_end:data_end + (-size) % 16])  # zero padding
    sizes = {name: size for _, name, size, _ in headers}
    n_in, n_out = len(result.inputs), len(result.outputs)
    assert sizes == {"vela_bin_stream": 0, "cmd_data": len(result.cmd_data), "weight_data": len(result.weight_data),
                     "scratch_size": 4, "inputs": 4 + 36 * n_in, "outputs": 4 + 36 * n_out, "vela_end_stream": 0}
    inputs_at = next(offset for offset, name, _, _ in headers if name == "inputs") + 32
    assert struct.unpack_from("<i6iiii", blob, inputs_at) == (n_in, *result.inputs[0].shape, 1,
                                                               result.inputs[0].offset, result.inputs[0].region)

    parsed = parse_payload(blob)
    assert (parsed.cmd_data, parsed.weight_data, parsed.scratch_size) == (
        result.cmd_data, result.weight_data, result.scratch_size)
    assert (parsed.inputs, parsed.outputs) == (result.inputs, result.outputs)
    assert parsed.blocks == [(name, size) for _, name, size, _ in headers]


def _blob() -> bytes:
    result = compile_tosa(GRAPHS["conv"], EthosUCompileSpec("ethos-u55-128"))
    return pack_payload(result)


def _rename(blob: bytes, old: str, new: str) -> bytes:
    offset = next(o for o, name, _, _ in _headers(blob) if name == old)
    return blob[:offset] + new.encode().ljust(16, b"\0") + blob[offset + 16:]


def _swap_first_data_blocks(blob: bytes) -> bytes:
    (_, _, _, _), cmd, weights, *_ = _headers(blob)
    cmd_end, weights_end = weights[0], weights[0] + 32 + -(-weights[2] // 16) * 16
    return blob[:cmd[0]] + blob[weights[0]:weights_end] + blob[cmd[0]:cmd_end] + blob[weights_end:]


def _with_byte(blob: bytes, offset: int, value: int) -> bytes:
    return blob[:offset] + bytes([value]) + blob[offset + 1:]


def _cmd_padding_offset(blob: bytes) -> int:
    offset, _, size, _ = _headers(blob)[1]
    assert size % 16, "the test needs a command stream whose size is not a multiple of 16"
    return offset + 32 + size


BROKEN = {
    "unknown block": (lambda b: _rename(b, "weight_data", "weights"), "unknown block 'weights'"),
    "bad order": (_swap_first_data_blocks, "block 1 is 'weight_data', expected 'cmd_data'"),
    "missing end": (lambda b: b[:-32], "ends before block 'vela_end_stream'"),
    "trailing bytes": (lambda b: b + bytes(16), "16 bytes follow the vela_end_stream block"),
    "truncated data": (lambda b: b[:100], "needs"),
    "misaligned header": (lambda b: b[:32] + bytes(8) + b[32:], "block name at byte 32 is not"),
    "truncated header": (lambda b: b[:40], "truncated block header at byte 32"),
    "external flag": (lambda b: _with_byte(b, 32 + 20, 1), "keeps its data outside the payload"),
    "non-zero padding": (lambda b: _with_byte(b, _cmd_padding_offset(b), 7), "non-zero padding"),
    "empty": (lambda b: b"", "ends before block 'vela_bin_stream'"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_parse_payload_rejects(case):
    damage, message = BROKEN[case]
    with pytest.raises(TosakitError, match=re.escape(message)):
        parse_payload(damage(_blob()))


def test_pack_rejects_float_sized_io(compiled):
    result = compiled["add", "ethos-u55-128"]
    bad = VelaTensor(result.inputs[0].shape, 8, 0, 1)
    with pytest.raises(TosakitError, match=r"input\[0\] has 8-byte elements"):
        pack_payload(SimpleNamespace(**{**vars(result), "inputs": [bad]}))


# ---------------------------------------------------------------------- flags


def test_both_flag_forms_agree():
    spaced = parse_vela_flags(["--accelerator-config", "ethos-u55-64", "--system-config", "S", "--memory-mode", "M",
                               "--optimise", "Size", "--arena-cache-size", "1024", "--config", "a.ini"])
    joined = parse_vela_flags(["--accelerator-config=ethos-u55-64", "--system-config=S", "--memory-mode=M",
                               "--optimise=Size", "--arena-cache-size=1024", "--config=a.ini"])
    assert spaced == joined
    assert (joined.accelerator, joined.optimise, joined.arena_cache_size, joined.configs) == (
        "ethos-u55-64", "Size", 1024, ["a.ini"])


def test_cop2_flag_is_honoured():
    result = compile_tosa(GRAPHS["add"], EthosUCompileSpec("ethos-u55-128", extra_flags="--cop-format COP2"))
    assert result.cmd_data[:4] == b"COP2"


def test_unknown_flag_is_named_with_the_supported_ones():
    with pytest.raises(TosakitError) as info:
        compile_tosa(GRAPHS["add"], EthosUCompileSpec("ethos-u55-128", extra_flags=["--output-dir=out"]))
    assert "'--output-dir=out'" in info.value.message
    assert "--optimise" in info.value.hint and "--arena-cache-size" in info.value.hint


@pytest.mark.parametrize("flags,message", [
    (["--optimise"], "--optimise needs a value"),
    (["--optimise", "Fast"], "invalid value 'Fast' for Vela flag --optimise"),
    (["--cpu-tensor-alignment=24"], "invalid value '24' for Vela flag --cpu-tensor-alignment"),
    (["--disable-cascading=yes"], "--disable-cascading takes no value"),
])
def test_bad_flag_values(flags, message):
    with pytest.raises(TosakitError, match=re.escape(message)):
        compile_tosa(GRAPHS["add"], EthosUCompileSpec("ethos-u55-128", extra_flags=flags))


def test_raw_output_format_is_required():
    with pytest.raises(TosakitError, match="--output-format"):
        parse_vela_flags(["--output-format=tflite"])


# ----------------------------------------------------------- refused operators


@pytest.mark.parametrize("target", TARGETS)
def test_float_add_is_refused(target):
    graph = binary_graph(ts.Op.ADD, "AddAttribute", ts.DType.FP32)
    with pytest.raises(TosakitError, match=r"TOSA operator ADD \(Vela: Add\)") as info:
        compile_tosa(graph, EthosUCompileSpec(target))
    assert "data type not supported" in info.value.message


def test_bitwise_and_is_refused_on_u55_only():
    graph = binary_graph(ts.Op.BITWISE_AND, "BitwiseAndAttribute", ts.DType.INT32)
    with pytest.raises(TosakitError, match=r"TOSA operator BITWISE_AND \(Vela: And\) for ethos-u55-128"):
        compile_tosa(graph, EthosUCompileSpec("ethos-u55-128"))
    assert compile_tosa(graph, EthosUCompileSpec("ethos-u85-256")).report.npu_ops == 1


def test_not_tosa_is_refused():
    with pytest.raises(TosakitError, match="not a TOSA flatbuffer"):
        compile_tosa(b"\x08\x00\x00\x00TFL3" + bytes(64), EthosUCompileSpec("ethos-u55-128"))


class _Overlay:
    """An object that answers like ``base`` except for the given attributes."""

    def __init__(self, base, **overrides):
        self._base, self._overrides = base, overrides

    def __getattr__(self, name):
        return self._overrides[name] if name in self._overrides else getattr(self._base, name)


def test_operator_left_on_cpu_is_refused(monkeypatch):
    """Regor refuses TOSA it cannot run; should it ever fall back to the CPU instead, we refuse."""
    real_compile = vela_backend.regor.compile

    def compile_with_cpu_fallback(*args, **kwargs):
        model = real_compile(*args, **kwargs)
        tables = dict(model.opt_database.tables)
        perf = tables["perf"]
        column = perf.header.index("operator")
        rows = [[*row[:column], "Passthrough", *row[column + 1:]] for row in perf.data]
        tables["perf"] = SimpleNamespace(header=perf.header, data=rows)
        return _Overlay(model, perf_report=_Overlay(model.perf_report, cpuOps=1),
                        opt_database=SimpleNamespace(tables=tables))

    monkeypatch.setattr(vela_backend.regor, "compile", compile_with_cpu_fallback)
    with pytest.raises(TosakitError, match=r"1 operator\(s\) on the CPU \(ADD\)"):
        compile_tosa(GRAPHS["add"], EthosUCompileSpec("ethos-u55-128"))


def test_a_vela_config_is_parsed_once_until_its_file_changes(tmp_path, monkeypatch):
    """Every Vela call reads its .ini; it is parsed once per file version: a second config of the same file costs
    no parse, and an edited file is read again."""
    import configparser

    from tosakit.backends.ethosu.vela_options import VelaConfig, vela_options
    from tosakit.specs import VELA_INI, resolve_vela_config

    ini = tmp_path / "my.ini"
    ini.write_text(resolve_vela_config(VELA_INI).read_text())
    reads = []
    real_read = configparser.ConfigParser.read
    monkeypatch.setattr(configparser.ConfigParser, "read", lambda self, paths, **kw: reads.append(paths) or
                        real_read(self, paths, **kw))
    opts = vela_options(EthosUCompileSpec("ethos-u55-128", config_ini=str(ini)))
    assert VelaConfig(opts).clock_hz == VelaConfig(opts).clock_hz == 500e6 and len(reads) == 1
    text = ini.read_text().replace("core_clock=500e6", "core_clock=400e6", 1)
    ini.write_text(text + "\n")  # a new size, whatever the file system's clock resolution
    assert VelaConfig(opts).clock_hz == 400e6 and len(reads) == 2
