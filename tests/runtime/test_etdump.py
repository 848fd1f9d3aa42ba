"""ETDump (.etdp): `tosakit run --etdump` records what ExecuTorch's runtime records, under its event names and
instruction ids; ExecuTorch's Inspector reads tosakit's files; `tosakit inspect` lists them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tosakit.cli import main
from tosakit.errors import TosakitError
from tosakit.program import etdump as E
from tosakit.program import schema as S

INPUTS = (torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1)),)


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.fc = nn.Conv2d(3, 4, 3), nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1)) + 1.0


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    """The net as tosakit compiles it: float and quantized CPU programs, and an Ethos-U55 delegate; its inputs."""
    from tosakit.flow import compile

    folder = tmp_path_factory.mktemp("etdump")
    made = {}
    for name, target, quantize, delegate in (("fp", "TOSA-1.0+FP", False, False), ("int", "TOSA-1.0+INT", True, False),
                                             ("u55", "ethos-u55-128", True, True)):
        made[name] = compile(_Net().eval(), INPUTS, target, quantize=quantize, delegate=delegate).program.save(
            folder / f"{name}.pte")
    np.savez(folder / "inputs.npz", arg0=INPUTS[0].numpy())
    return folder, made


def _run(folder, pte, *extra) -> E.ETDump:
    path = folder / f"{pte.stem}.etdp"
    assert main(["run", str(pte), "--inputs", str(folder / "inputs.npz"), "--etdump", str(path), *extra]) == 0
    return E.deserialize_etdump(path.read_bytes())


def _kernel_calls(pte) -> list[tuple[int, str]]:
    from tosakit.program.pte import deserialize_pte

    plan = deserialize_pte(pte.read_bytes())[0].execution_plan[0]
    return [(pc, f"native_call_{plan.operators[i.instr_args.op_index].name.split('::')[1]}."
                 f"{plan.operators[i.instr_args.op_index].overload}")
            for pc, i in enumerate(plan.chains[0].instructions) if isinstance(i.instr_args, S.KernelCall)]


def test_etdump_tables_keep_their_schema_defaults_and_size_prefix():
    """Ids of -1 (the schema default) and 0 both read back as written; the file is size-prefixed, and a prefix
    that disagrees with the file is refused."""
    dump = E.ETDump(0, [E.RunData("Execute", 2, None, [
        E.Event(E.ProfileEvent("DELEGATE_CALL", 0, 0, -1, None, None, 10, 25)),
        E.Event(E.ProfileEvent("7", 0, 3, 7, None, b"meta", 11, 12))])])
    data = E.serialize_etdump(dump)
    assert int.from_bytes(data[:4], "little") == len(data) - 4 and data[8:12] == b"ED00"
    assert E.deserialize_etdump(data) == dump
    with pytest.raises(TosakitError, match="corrupt .etdp: its size prefix says"):
        E.deserialize_etdump(data[:-4])


def test_run_records_an_event_per_instruction_fp(programs, capsys):
    """One Default block (Method::init inside Program::load_method), one Execute block: per kernel call its
    native_call_<op>.<overload> then OPERATOR_CALL at its instruction index, Method::execute last; with
    --debug-outputs each kernel's output, and the program's output flagged, whose bytes in the debug buffer are
    the outputs `run` printed."""
    folder, made = programs
    dump = _run(folder, made["fp"], "--debug-outputs", "--outputs", str(folder / "out.npz"))
    assert "wrote ETDump" in capsys.readouterr().out
    default, execute = dump.run_data
    assert [e.profile_event.name for e in default.events] == ["Method::init", "Program::load_method"]
    profile = [(e.profile_event.instruction_id, e.profile_event.name) for e in execute.events if e.profile_event]
    want = [event for pc, name in _kernel_calls(made["fp"]) for event in ((pc, name), (pc, "OPERATOR_CALL"))]
    assert profile == want + [(0, "Method::execute")]
    assert all(e.profile_event.end_time >= e.profile_event.start_time for e in execute.events if e.profile_event)
    debug = [e.debug_event for e in execute.events if e.debug_event]
    assert [d.instruction_id for d in debug[:-1]] == [pc for pc, _ in _kernel_calls(made["fp"])]
    output = debug[-1]
    assert output.chain_index == E.UNSET_CHAIN and output.debug_entry.output.bool_val
    t = output.debug_entry.tensor
    buffer = (folder / "fp.debug.bin").read_bytes()
    logged = np.frombuffer(buffer[t.offset:t.offset + 4 * int(np.prod(t.sizes))], np.float32).reshape(t.sizes)
    assert np.array_equal(logged, np.load(folder / "out.npz")["out0"])
    assert main(["inspect", str(folder / "fp.etdp")]) == 0
    listed = capsys.readouterr().out
    assert f"block 1 Execute: {len(profile)} profile event(s), {len(debug)} logged value(s)" in listed
    assert f"instruction    {want[0][0]}" in listed and want[0][1] in listed


def test_a_bundled_run_names_its_test_case_fp(programs, tmp_path):
    """A .bpte's runs carry their test case's index (bundled_input_index), one Execute block each."""
    from tosakit.program.bundled import BundledProgram, MethodTestCase, MethodTestSuite, \
        serialize_from_bundled_program_to_flatbuffer

    _, made = programs
    cases = [MethodTestCase(list(INPUTS)), MethodTestCase([INPUTS[0] * 2])]
    bundle = BundledProgram(pte_file_path=str(made["fp"]), method_test_suites=[MethodTestSuite("forward", cases)])
    (tmp_path / "b.bpte").write_bytes(serialize_from_bundled_program_to_flatbuffer(bundle))
    assert main(["run", str(tmp_path / "b.bpte"), "--etdump", str(tmp_path / "b.etdp")]) == 0
    dump = E.deserialize_etdump((tmp_path / "b.etdp").read_bytes())
    assert [(r.name, r.bundled_input_index) for r in dump.run_data] == [("Default", -1), ("Execute", 0),
                                                                         ("Execute", 1)]


@pytest.mark.parametrize("flag, message", [
    (["--debug-outputs"], "--debug-outputs logs the outputs into an ETDump"),
    (["--etdump", "{folder}"], "is not a regular file"),
    (["--etdump", "{folder}/missing/x.etdp"], "does not exist"),
    (["--etdump", "{pte}"], "is the input file itself"),
])
def test_bad_etdump_paths_are_refused_before_the_run(programs, flag, message, capsys):
    folder, made = programs
    flag = [f.format(folder=folder, pte=made["fp"]) for f in flag]
    assert main(["run", str(made["fp"]), "--random", *flag]) == 2
    err = capsys.readouterr().err
    assert message in err and "output 0" not in err


@pytest.mark.oracle
def test_inspector_reads_tosakits_etdump_as_executorchs_own_int(programs, et_oracle):
    """ExecuTorch's runtime, run with ETDump on, records the same events under the same names and instruction
    ids as tosakit for the float and the quantized CPU programs; its Inspector opens tosakit's files and counts
    what tosakit ran."""
    folder, made = programs
    for name in ("fp", "int"):
        ours = _run(folder, made[name], "--debug-outputs")
        theirs = et_oracle.etdump(folder / f"{name}.et.etdp", pte=made[name], inputs=INPUTS)
        read = et_oracle.etdump(folder / f"{name}.etdp", debug_buffer=folder / f"{name}.debug.bin")
        assert [b[0] for b in read] == [b[0] for b in theirs] == ["Default", "Execute"]
        assert [e[:2] for e in read[1][1]] == [e[:2] for e in theirs[1][1]], name
        kernels = len(_kernel_calls(made[name]))
        assert len(read[1][1]) == 2 * kernels + 1 == sum(1 for e in ours.run_data[1].events if e.profile_event)
        assert all(e[2] == 1 and e[3] == 1 for e in read[1][1][:-1])  # one run timed; the kernel's output logged


@pytest.mark.oracle
def test_inspector_reads_a_delegated_programs_etdump_u55(programs, et_oracle):
    """The Ethos-U delegate call is EthosUBackend::execute() inside DELEGATE_CALL at its instruction, its tensors
    logged (input and output), each operation of its command stream a delegate event (estimated device time); the
    CPU kernels around it keep their names."""
    folder, made = programs
    _run(folder, made["u55"], "--debug-outputs")
    events = et_oracle.etdump(folder / "u55.etdp", debug_buffer=folder / "u55.debug.bin")[1][1]
    npu = [e for e in events if e[0].isdigit()]  # each NPU operation, a delegate event named by its debug id
    assert npu and [e[0] for e in npu] == [str(k) for k in range(len(npu))]
    events = [e for e in events if not e[0].isdigit()]
    assert [e[0] for e in events] == ["native_call_quantize_per_tensor.out", "OPERATOR_CALL",
                                      "EthosUBackend::execute()", "DELEGATE_CALL",
                                      "native_call_dequantize_per_tensor.out", "OPERATOR_CALL", "Method::execute"]
    assert events[2][1:] == events[3][1:] == [1, 1, 2]


def test_damaged_etdumps_are_refused_or_listed_never_crash_fp(programs):
    """200 seeded byte mutations of an ETDump: `inspect` lists it or refuses it with a TosakitError."""
    import random

    from tosakit.runtime.trace import event_lines

    folder, made = programs
    data = E.serialize_etdump(_run(folder, made["fp"], "--debug-outputs"))
    rng, refused = random.Random(0), 0
    for _ in range(200):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 6)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        try:
            event_lines(E.deserialize_etdump(bytes(damaged)))
        except TosakitError:
            refused += 1
    assert 0 < refused < 200
