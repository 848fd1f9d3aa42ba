"""A .pte from anywhere: the hand-made attacks of the safety issue, damaged delegate TOSA, and a mutation
sweep over every kind of program tosakit writes — each refused with one clear error, nothing written,
without importing torch (so in a fraction of a second and little memory), never a crash, hang or
foreign exception."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tosakit.errors import TosakitError
from tosakit.program import schema as S
from tosakit.program.pte import deserialize_pte, serialize_pte
from tosakit.runtime import Limits, LoadedProgram

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
sys.path.insert(0, str(FUZZ))
from seeds import build_seeds  # noqa: E402
from sweep import report, sweep  # noqa: E402

PEAK_MB = 200


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, Path]:
    return {p.stem: p for p in build_seeds(tmp_path_factory.mktemp("seeds"))}


def _edit(path: Path, change) -> bytes:
    """The program at ``path`` with ``change(program, plan)`` applied to its forward method."""
    program, segments = deserialize_pte(path.read_bytes())
    change(program, program.execution_plan[0])
    return serialize_pte(program, segments)


def _foreign_operator(name, overload):
    def change(program, plan):
        plan.operators[0] = S.Operator(name, overload)
    return change


def _self_jump(program, plan):
    plan.values.append(S.EValue(S.Bool(False)))
    jump = S.Instruction(S.JumpFalseCall(len(plan.values) - 1, 0))
    plan.chains[0].instructions.insert(0, jump)


def _huge_arena(program, plan):
    plan.non_const_buffer_sizes[1] = 1 << 40


def _huge_input(program, plan):
    tensor = plan.values[plan.inputs[0]].val
    plan.values[plan.inputs[0]] = S.EValue(dataclasses.replace(tensor, sizes=[1, 1 << 29], dim_order=[0, 1]))


def _damaged_tosa(program, plan):
    data = bytearray(program.backend_delegate_data[0].data)
    root = int.from_bytes(data[:4], "little")
    data[root:root + 2] = b"\0\0"  # the root table's vtable offset: the graph now starts nowhere
    program.backend_delegate_data[0] = S.BackendDelegateInlineData(bytes(data))


REPRODUCERS = {
    # name: (seed, change, words the error must hold)
    "from_file": ("cpu_fp", _foreign_operator("aten::from_file", "out"), ["aten::from_file.out", "not an ExecuTorch"]),
    "not_a_kernel": ("cpu_int", _foreign_operator("aten::_foreach_add", "List"), ["aten::_foreach_add.List"]),
    "self_jump": ("cpu_fp", _self_jump, ["instruction 0 jumps to itself"]),
    "arena_1tb": ("cpu_fp", _huge_arena, ["1099511627776 bytes", "--max-memory"]),
    "input_2gb": ("cpu_fp", _huge_input, ["claims [1, 536870912] FLOAT", "--max-memory"]),
    "damaged_tosa": ("tosa_fp", _damaged_tosa, ["TOSA graph", "TOSABackend"]),
}


def _cli(argv: list[str]) -> tuple[int, str, str, float]:
    """`tosakit` in a fresh process: exit status, whether torch got imported, stderr, peak resident MB."""
    code = ("import re, sys; from tosakit.cli import main; rc = main(sys.argv[1:]); "
            "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1); "
            "print('torch' in sys.modules, hwm); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    imported, hwm_kb = proc.stdout.split()[-2:]
    return proc.returncode, imported, proc.stderr, int(hwm_kb) / 1024


@pytest.mark.parametrize("name", list(REPRODUCERS))
def test_hostile_program_is_refused_before_torch(name, seeds, tmp_path):
    seed, change, words = REPRODUCERS[name]
    evil = tmp_path / f"{name}.pte"
    evil.write_bytes(_edit(seeds[seed], change))
    outputs = tmp_path / "o.npz"
    code, out, err, peak = _cli(["run", str(evil), "--random", "--outputs", str(outputs)])
    lines = err.strip().splitlines()
    assert code == 2 and lines[0].startswith("error: ") and len(lines) == 2 and lines[1].startswith("  fix: "), err
    for w in words:
        assert w in err, err
    assert not outputs.exists() and list(tmp_path.iterdir()) == [evil]
    assert out == "False", "validation imported torch: a bad file costs seconds and hundreds of MB"
    assert peak < PEAK_MB, f"{peak:.0f} MB"
    code, out, err, _ = _cli(["inspect", str(evil)])
    assert code == 2 and err.startswith("error: ") and out == "False", err


def test_a_generous_limit_lets_a_trusted_large_plan_through(seeds):
    """The ceiling is the user's: a file's plan beyond the default runs when the user raises it."""
    data = _edit(seeds["cpu_fp"], lambda program, plan: plan.non_const_buffer_sizes.__setitem__(1, 3 << 30))
    with pytest.raises(TosakitError, match="3221225472 bytes of arena memory"):
        LoadedProgram(data, "big.pte")
    loaded = LoadedProgram(data, "big.pte", limits=Limits(max_memory=4 << 30))
    assert sum(loaded.layouts["forward"].arena_bytes) < 1 << 20  # only the bytes its tensors use are allocated


def test_backward_jump_must_change_its_condition(seeds):
    def loop(program, plan):
        plan.values.append(S.EValue(S.Bool(False)))
        plan.chains[0].instructions.append(S.Instruction(S.JumpFalseCall(len(plan.values) - 1, 0)))

    with pytest.raises(TosakitError, match="jumps back to 0, but nothing in between changes its condition"):
        LoadedProgram(_edit(seeds["cpu_fp"], loop), "loop.pte")


def test_kernel_call_checked_against_its_schema(seeds):
    def wrong_kind(program, plan):
        call = next(i.instr_args for i in plan.chains[0].instructions if isinstance(i.instr_args, S.KernelCall))
        call.args[0] = next(k for k, v in enumerate(plan.values) if isinstance(v.val, S.Int))

    with pytest.raises(TosakitError, match=r"instruction \d+ \(.*\) argument .* is value \d+, a Int, where a Tensor"):
        LoadedProgram(_edit(seeds["cpu_fp"], wrong_kind), "kind.pte")


def test_damaged_delegate_tosa_never_reaches_the_reference_model_unchecked(seeds):
    """Two zeroed bytes anywhere in a TOSA delegate's flatbuffer tables: refused by the checker, or run
    in the reference model's own process — never a crash of this one."""
    program, segments = deserialize_pte(seeds["tosa_fp"].read_bytes())
    tosa = program.backend_delegate_data[0].data
    rng = random.Random(0)
    refused = ran = 0
    for pos in sorted(rng.sample(range(0, min(len(tosa), 2048) - 2), 40)):
        damaged = tosa[:pos] + b"\0\0" + tosa[pos + 2:]
        program.backend_delegate_data[0] = S.BackendDelegateInlineData(damaged)
        try:
            loaded = LoadedProgram(serialize_pte(program, segments), f"tosa@{pos}.pte")
            loaded.run([_zeros_input(loaded)])
            ran += 1
        except TosakitError:
            refused += 1
    assert refused + ran == 40 and refused > 0


def _zeros_input(loaded):
    import torch

    spec = loaded.input_specs()[0]
    return torch.zeros(spec.shape, dtype=spec.dtype)


@pytest.mark.slow
def test_mutation_sweep(seeds):
    """CI's share of `make fuzz`: damaged copies of every seed program, each in its own process."""
    summary = sweep(sorted(seeds.values()), cases=int(os.environ.get("TOSAKIT_SWEEP_CASES", 1000)), jobs=2,
                    progress=False)
    print(report(summary))
    assert summary["seeds"] >= 8 and not summary["problems"], report(summary)
    assert summary["peak_mb"] <= 500
