"""`tosakit run` on the Ethos-U simulator: the engine choice (npu, tosa, default), the simulated delegate's
outputs against its carried TOSA bit for bit (built-in models, NCHW and channels-last I/O), damaged command
streams and simulation faults as one `error:` line naming the command offset, the run's limits, --verify."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from support.op_cases import sweep_models
from support.shared import SharedFiles, run_folder
from tosakit.backends.ethosu.payload import pack_payload, parse_payload
from tosakit.backends.ethosu.vela import VelaResult
from tosakit.cli import main
from tosakit.errors import TosakitError
from tosakit.flow import compile
from tosakit.program import schema as S
from tosakit.program.pte import deserialize_pte, serialize_pte, tosa_key
from tosakit.runtime import Limits, LoadedProgram, load
from tosakit.runtime.ethosu.commands import decode
from tosakit.specs import EthosUCompileSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "fuzz"))
from seeds import SmallNet  # noqa: E402  (conv with 3 input channels, relu, pool, linear: the I/O layout matters)

pytestmark = pytest.mark.numerics


class SelfMatMul(nn.Module):
    """x @ x^T: on Ethos-U85 a MatMul reading IFM2 as its weights."""

    def forward(self, x):
        return torch.matmul(x, x.transpose(1, 2))


def _compile(target: str, debug_info: bool, channels_last: bool = False, model: nn.Module | None = None) -> bytes:
    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8) if model is None else torch.randn(1, 8, 16)
    x = x.to(memory_format=torch.channels_last) if channels_last else x
    spec = EthosUCompileSpec(target)
    spec = spec.with_debug_info() if debug_info else spec
    return compile((model or SmallNet()).eval(), (x,), spec, quantize=True).program.buffer


# SmallNet for ethos-u55-128 with its TOSA (also with channels-last input), without, and for ethos-u85-256; a U85 MatMul
PROGRAMS = {"u55": lambda: _compile("ethos-u55-128", True),
            "u55_nhwc": lambda: _compile("ethos-u55-128", True, channels_last=True),
            "u55_payload_only": lambda: _compile("ethos-u55-128", False), "u85": lambda: _compile("ethos-u85-256", True),
            "u85_matmul": lambda: _compile("ethos-u85-256", True, model=SelfMatMul())}


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> SharedFiles:
    """PROGRAMS' .pte files, each compiled once per test run when a test first needs it."""
    return SharedFiles(run_folder(tmp_path_factory) / "npu_engine", ".pte",
                       lambda name, path: path.write_bytes(PROGRAMS[name]()))


def _cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def _one_error(code: int, err: str, *words: str) -> None:
    """Exit 2 and exactly an `error:` line and its `fix:` line, holding ``words``."""
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  fix: "), err
    for w in words:
        assert w in err, err


def _input(path: Path) -> list[torch.Tensor]:
    spec = load(path).input_specs()[0]
    return [torch.randn(spec.shape, generator=torch.Generator().manual_seed(1))]


# ------------------------------------------------------------------ the engine choice


@pytest.mark.parametrize("name", ["u55", "u55_nhwc", "u85", "u85_matmul"])
def test_npu_and_tosa_engines_agree_bit_for_bit(programs, name):
    """The delegate call's tensors are the I/O table's bytes in their stored order (NHWC for channels-last
    ones): the simulator's outputs are the TOSA's, bit for bit, through the whole program."""
    path = programs[name]
    default, npu, tosa = load(path), load(path, engine="npu"), load(path, engine="tosa")
    in_process = LoadedProgram(path.read_bytes(), name, isolate=False)  # tosakit's own programs: no child process
    assert list(default.layouts["forward"].delegate_npu) == list(npu.layouts["forward"].delegate_npu) == [0]
    assert not tosa.layouts["forward"].delegate_npu
    if name == "u55_nhwc":
        plan = npu.plan()
        assert list(plan.values[plan.inputs[0]].val.dim_order) == [0, 2, 3, 1]
    x = _input(path)
    runs = [program.run(x)[0] for program in (default, npu, in_process, tosa)]
    assert runs[0].dtype == torch.float32 and len({r.numpy().tobytes() for r in runs}) == 1


def test_without_debug_info_the_simulator_runs_it(programs, tmp_path, capsys):
    """The payload-only program gives what the same program with its TOSA gives on the tosa engine."""
    with_tosa, payload_only = programs["u55"], programs["u55_payload_only"]
    assert _payload(with_tosa) == _payload(payload_only)
    np.savez(tmp_path / "in.npz", arg0=_input(with_tosa)[0].numpy())
    runs = {}
    for key, path, engine in (("npu", payload_only, []), ("tosa", with_tosa, ["--engine", "tosa"])):
        out = tmp_path / f"{key}.npz"
        code, printed, _ = _cli(capsys, "run", path, "--inputs", tmp_path / "in.npz", "--outputs", out, *engine)
        assert code == 0 and ("on the NPU simulator" in printed) == (key == "npu"), printed
        runs[key] = np.load(out)["out0"]
    assert runs["npu"].tobytes() == runs["tosa"].tobytes()
    code, printed, _ = _cli(capsys, "inspect", payload_only)
    assert code == 0 and "host engine: npu" in printed and "TOSA for host runs: not carried" in printed


def test_tosa_engine_without_tosa_says_recompile_with_debug_info(programs, tmp_path, capsys):
    code, _, err = _cli(capsys, "run", programs["u55_payload_only"], "--random", "--engine", "tosa",
                        "--outputs", tmp_path / "o.npz")
    _one_error(code, err, "delegate 0 (EthosUBackend)", "no TOSA graph", "tosa engine", "--debug-info")
    assert not (tmp_path / "o.npz").exists()


def _accumulators_kept(payload) -> None:
    """The U85 stream's last ACC_FORMAT made to keep the accumulators (a split contraction), which the simulator
    does not run yet."""
    commands, start = _stream(payload)
    last = [c for c in commands if c.register.name == "NPU_SET_ACC_FORMAT"][-1]
    _word(payload, start + last.offset, (last.value | 1 << 4) << 16 | last.register.code)


def test_u85_stream_the_simulator_does_not_run_yet_runs_its_tosa(programs, tmp_path, capsys):
    path = _with_payload(programs["u85_matmul"], _accumulators_kept, tmp_path / "keep.pte", keep_tosa=True)
    assert not load(path).layouts["forward"].delegate_npu  # the default engine runs its TOSA
    code, out, _ = _cli(capsys, "run", path, "--random")
    assert code == 0 and "on the NPU simulator" not in out
    code, _, err = _cli(capsys, "run", path, "--random", "--engine", "npu")
    _one_error(code, err, "delegate 0, EthosUBackend", "Ethos-U85", "does not run yet",
               "NPU_SET_ACC_FORMAT acc_input = ACC_INPUT_KEEP", "--engine tosa")
    code, out, _ = _cli(capsys, "inspect", path)
    assert code == 0 and "host engine: tosa" in out
    code, out, _ = _cli(capsys, "inspect", programs["u85_matmul"])
    assert code == 0 and "host engine: npu" in out


def test_unknown_engine_is_refused(programs, capsys):
    with pytest.raises(TosakitError, match="unknown engine 'gpu'"):
        load(programs["u55"], engine="gpu")
    with pytest.raises(SystemExit):
        main(["run", str(programs["u55"]), "--random", "--engine", "gpu"])
    assert "invalid choice: 'gpu'" in capsys.readouterr().err


# ------------------------------------------------------------------ the run's limits


def test_simulator_memory_counts_against_the_limit(programs, capsys):
    """Scratch, weights and the 2 MiB fast scratch (each byte with its written flag), refused at load; the tosa
    engine does not need them."""
    path = programs["u55"]
    payload = parse_payload(_payload(path))
    code, _, err = _cli(capsys, "run", path, "--random", "--max-memory", "1M")
    _one_error(code, err, "delegate 0, EthosUBackend", "simulating it needs", f"scratch {payload.scratch_size}",
               f"weights {len(payload.weight_data)}", "fast scratch 2097152", "--max-memory")
    load(path, limits=Limits(max_memory=1 << 20), engine="tosa")
    load(path, limits=Limits(max_memory=5 << 20))


def test_the_run_deadline_reaches_the_simulator(programs, monkeypatch):
    """In this process (tosakit's own programs) and in the child process (files)."""
    import time

    from tosakit.runtime import execute
    from tosakit.runtime.tosa_sandbox import IsolatedReferenceModel

    seen = []
    real, real_child = execute.simulate, IsolatedReferenceModel.simulate

    def spy(payload, inputs, accelerator=None, deadline=None, **options):
        seen.append(deadline)
        return real(payload, inputs, accelerator, deadline, **options)

    def child_spy(self, payload, inputs, what, *options):
        seen.append(self.deadline)  # the child's simulator gets it with each request
        return real_child(self, payload, inputs, what, *options)

    monkeypatch.setattr(execute, "simulate", spy)
    monkeypatch.setattr(IsolatedReferenceModel, "simulate", child_spy)
    limits = Limits(timeout=30.0)
    for program in (LoadedProgram(programs["u55"].read_bytes(), limits=limits, isolate=False),
                    load(programs["u55"], limits=limits)):
        start = time.monotonic()
        program.run(_input(programs["u55"]))
        assert start < seen[-1] <= time.monotonic() + 30.0
    assert len(seen) == 2


# ------------------------------------------------------------------ --verify: the simulator against the TOSA


def test_verify_compares_each_delegate_output(programs, capsys):
    code, out, _ = _cli(capsys, "run", programs["u55"], "--random", "--verify")
    assert code == 0 and "npu vs tosa: delegate 0 (EthosUBackend) output 0: 10 of 10 values equal (bit-exact)" in out
    # and per NPU operation, in the child process (Vela run again on the carried TOSA with the delegate's flags)
    found = re.search(r"NPU operations: (\d+) of (\d+) compared with the TOSA tensor each computes: all bit-exact", out)
    assert found and 1 <= int(found.group(1)) <= int(found.group(2)), out
    code, _, err = _cli(capsys, "run", programs["u55_payload_only"], "--random", "--verify")
    _one_error(code, err, "carry no TOSA", "--debug-info")
    code, _, err = _cli(capsys, "run", programs["u55"], "--random", "--verify", "--engine", "tosa")
    _one_error(code, err, "--verify", "drop --engine tosa")


def test_verify_reports_a_difference(programs, monkeypatch, capsys):
    """A simulator off by one in one value: named with the count and the largest difference, exit 1."""
    from tosakit.runtime.tosa_sandbox import IsolatedReferenceModel

    real = IsolatedReferenceModel.simulate

    def off_by_one(*args):
        outputs, profile = real(*args)
        outputs[0].reshape(-1)[3] ^= 1
        return outputs, profile

    monkeypatch.setattr(IsolatedReferenceModel, "simulate", off_by_one)
    code, out, err = _cli(capsys, "run", programs["u55"], "--random", "--verify")
    assert code == 1 and "output 0: 9 of 10 values equal (1 differ, max |diff| 1)" in out
    assert "differ on 1 delegate output(s) and 0 NPU operation(s)" in err


def test_compile_verify_compares_the_engines(monkeypatch):
    """`compile --verify` runs the program on the simulator and says whether each delegate output is its TOSA's,
    bit for bit; a simulator that stops is shown, and the figures are then the TOSA's."""
    from tosakit.runtime import execute
    from tosakit.runtime.ethosu.memory import NpuAccessError
    from tosakit.verify.run import verify

    torch.manual_seed(0)
    model, inputs = SmallNet().eval(), (torch.randn(1, 3, 8, 8),)
    compiled = compile(model, inputs, "ethos-u55-128", quantize=True)
    report = verify(compiled.edge, compiled.program, inputs, model, compiled.quantized)
    assert [(c.delegate, c.output, c.bit_exact) for c in report.engines] == [(0, 0, True)] and not report.npu_error
    assert "Ethos-U command streams run on the NPU simulator: 1 of 1 delegate output(s) bit-exact" in report.table()

    def stops(*args, **kwargs):
        raise NpuAccessError("command at offset 0x100 (NPU_OP_POOL) writes bytes [0x0, 0x10) of region 1")

    monkeypatch.setattr(execute, "simulate", stops)
    stopped = verify(compiled.edge, compiled.program, inputs, model, compiled.quantized)
    assert not stopped.engines and "command at offset 0x100 (NPU_OP_POOL)" in stopped.npu_error
    assert "stopped (" in stopped.table() and "the figures above are the delegates' TOSA" in stopped.table()
    assert stopped.outputs[0].vs_fake_quant.max_abs_error == report.outputs[0].vs_fake_quant.max_abs_error


# ------------------------------------------------------------------ damaged command streams, faults in the run


def _payload(path: Path) -> bytes:
    program, segments = deserialize_pte(path.read_bytes())
    ref = program.execution_plan[0].delegates[0].processed
    return (program.backend_delegate_data[ref.index].data if ref.location == S.DataLocation.INLINE
            else segments[ref.index])


def _with_payload(path: Path, change, out: Path, keep_tosa: bool = False) -> Path:
    """The program at ``path`` with its Ethos-U payload rewritten by ``change(payload)`` (in place); with
    ``keep_tosa`` its carried TOSA still found (under the new payload's key)."""
    program, segments = deserialize_pte(path.read_bytes())
    old = tosa_key(_payload(path))
    ref = program.execution_plan[0].delegates[0].processed
    payload = parse_payload(_payload(path))
    change(payload)
    blob = pack_payload(VelaResult(payload.cmd_data, payload.weight_data, payload.scratch_size, 0, payload.inputs,
                                   payload.outputs, None))
    if ref.location == S.DataLocation.INLINE:
        program.backend_delegate_data[ref.index] = S.BackendDelegateInlineData(blob)
    else:
        segments[ref.index] = blob
    for named in program.named_data if keep_tosa else ():
        named.key = tosa_key(blob) if named.key == old else named.key
    out.write_bytes(serialize_pte(program, segments))
    return out


def _stream(payload) -> tuple[list, int]:
    """The decoded commands and the byte where the register command stream starts in cmd_data (Vela puts it
    last)."""
    commands = decode(payload.cmd_data).commands
    return commands, len(payload.cmd_data) - 4 * sum(2 if c.data is not None else 1 for c in commands)


def _word(payload, byte: int, value: int) -> None:
    data = bytearray(payload.cmd_data)
    data[byte:byte + 4] = value.to_bytes(4, "little")
    payload.cmd_data = bytes(data)


def _truncated_in_a_command(payload) -> str:
    """The stream cut after the first word of a cmd1, its length in the header made to match."""
    commands, start = _stream(payload)
    cut = next(c for c in commands if c.data is not None and c.offset > 0)
    length = cut.offset // 4 + 1
    header = int.from_bytes(payload.cmd_data[start - 4:start], "little")
    payload.cmd_data = payload.cmd_data[:start + 4 * length]
    _word(payload, start - 4, (header & 0xFF) | ((length >> 16) << 8) | ((length & 0xFFFF) << 16))
    return rf"offset {cut.offset:#08x} .*{cut.register.name} lacks its data word"


def _truncated(payload) -> str:
    """cmd_data cut short of the stream length its header states."""
    _, start = _stream(payload)
    payload.cmd_data = payload.cmd_data[:-8]
    return rf"cmd_data byte {start - 4:#x}: the header gives the command stream"


def _unknown_opcode(payload) -> str:
    commands, start = _stream(payload)
    c = commands[5]
    _word(payload, start + c.offset, (c.param << 16) | 0x0004)
    return rf"offset {c.offset:#08x} \(byte {start + c.offset:#x} of cmd_data\): unknown command code 0x0004"


def _ofm_outside_its_region(payload) -> str:
    """The first NPU_SET_OFM_BASE0 pointed 2 GiB on: the next operation writes outside the scratch region."""
    commands, start = _stream(payload)
    k, base = next((k, c) for k, c in enumerate(commands) if c.register.name == "NPU_SET_OFM_BASE0")
    _word(payload, start + base.offset + 4, 0x7FFFFFF0)
    op = next(c for c in commands[k:] if c.register.name.startswith("NPU_OP_"))
    return rf"command at offset {op.offset:#x} \({op.register.name}\) writes bytes \[0x7ffffff0, .* of region 1"


def _ifm_reads_unwritten_scratch(payload) -> str:
    """The first operation's IFM moved off the input, to scratch bytes nothing wrote yet."""
    commands, start = _stream(payload)
    t = payload.inputs[0]
    nbytes = int(np.prod(t.shape)) * t.elem_size
    assert t.region == 1 and t.offset >= nbytes  # bytes [0, nbytes) of the scratch are not the input
    k, base = next((k, c) for k, c in enumerate(commands) if c.register.name == "NPU_SET_IFM_BASE0")
    _word(payload, start + base.offset + 4, 0)
    op = next(c for c in commands[k:] if c.register.name.startswith("NPU_OP_"))
    return rf"command at offset {op.offset:#x} \({op.register.name}\) reads byte 0x0 of region 1 .*no earlier"


def _weights_cut_short(payload) -> str:
    """The first weight stream's length cut to 16 bytes: Vela's codec (native code) ends the process that
    decodes it, the child process the simulator runs in for a file."""
    commands, start = _stream(payload)
    length = next(c for c in commands if c.register.name == "NPU_SET_WEIGHT_LENGTH")
    _word(payload, start + length.offset + 4, 16)
    return r"EthosUBackend\): .*(simulator stopped|weight stream)"


DAMAGE = {"truncated_in_a_command": (_truncated_in_a_command, True),
          "truncated": (_truncated, True),
          "unknown_opcode": (_unknown_opcode, True),
          "ofm_outside_its_region": (_ofm_outside_its_region, False),
          "ifm_reads_unwritten_scratch": (_ifm_reads_unwritten_scratch, False),
          "weights_cut_short": (_weights_cut_short, False)}


@pytest.mark.parametrize("name", DAMAGE)
def test_damaged_stream_is_one_error_naming_the_command(name, programs, tmp_path, capsys):
    """Decoding faults are refused at load (run and inspect alike); faults in the run stop it at the command,
    with nothing written."""
    change, at_load = DAMAGE[name]
    found = []
    evil = _with_payload(programs["u55_payload_only"], lambda p: found.append(change(p)), tmp_path / "evil.pte")
    [pattern] = found
    outputs = tmp_path / "o.npz"
    code, _, err = _cli(capsys, "run", evil, "--random", "--outputs", outputs)
    _one_error(code, err, "evil.pte", "delegate 0, EthosUBackend")
    assert re.search(pattern, err), err
    assert not outputs.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["evil.pte"]
    code, _, err = _cli(capsys, "inspect", evil)
    if at_load:
        _one_error(code, err)
        assert re.search(pattern, err), err
        with pytest.raises(TosakitError):
            LoadedProgram(evil.read_bytes(), "evil.pte", engine="tosa")  # a damaged file whatever the engine
    else:
        assert code == 0, err


# ------------------------------------------------------------------ the built-in models


SLOW = {"mv2", "mv3", "resnet18", "transformer", "unet"}


@pytest.mark.parametrize("model_name", [pytest.param(m, marks=pytest.mark.slow) if m in SLOW else m
                                        for m in sweep_models()])
def test_builtin_model_npu_equals_tosa(model_name, tmp_path, capsys):
    """The same .pte (int8, ethos-u55-128, with its TOSA) run with --engine npu and --engine tosa: the same
    outputs, bit for bit, and --verify finds every delegate output bit-exact."""
    pte = tmp_path / f"{model_name}.pte"
    code, _, err = _cli(capsys, "compile", "-m", model_name, "--delegate", "--quantize", "--target", "ethos-u55-128",
                        "--debug-info", "-q", "-o", pte)
    assert code == 0, err
    assert load(pte).layouts["forward"].delegate_npu, "no delegate runs on the simulator"
    runs = {}
    for engine in ("npu", "tosa"):
        code, _, err = _cli(capsys, "run", pte, "--random", "--engine", engine, "--outputs", tmp_path / f"{engine}.npz")
        assert code == 0, err
        with np.load(tmp_path / f"{engine}.npz") as saved:
            runs[engine] = [(saved[k].dtype, saved[k].shape, saved[k].tobytes()) for k in sorted(saved.files)]
    assert runs["npu"] == runs["tosa"]
    code, out, err = _cli(capsys, "run", pte, "--random", "--verify")
    assert code == 0 and "npu vs tosa:" in out and "differ" not in out, out + err
