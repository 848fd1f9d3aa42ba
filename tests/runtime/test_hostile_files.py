"""A .pte from anywhere: the hand-made attacks of the safety issue, damaged delegate TOSA, and a mutation
sweep over every kind of program tosakit writes — each refused with one clear error, nothing written,
without importing torch (so in a fraction of a second and little memory), never a crash, hang or
foreign exception."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest

from tosakit.errors import TosakitError
from tosakit.program import schema as S
from tosakit.program.pte import deserialize_pte, serialize_pte
from tosakit.runtime import Limits, LoadedProgram

FUZZ = Path(__file__).resolve().parents[2] / "fuzz"
sys.path.insert(0, str(FUZZ))
from attacks import REPRODUCERS, edit, run_cli, write  # noqa: E402
from seeds import build_seeds  # noqa: E402
from sweep import report, sweep  # noqa: E402

PEAK_MB = 200


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, Path]:
    return {p.stem: p for p in build_seeds(tmp_path_factory.mktemp("seeds"))}


@pytest.mark.parametrize("name", list(REPRODUCERS))
def test_hostile_program_is_refused_before_torch(name, seeds, tmp_path):
    words = REPRODUCERS[name][2]
    evil = write(name, seeds, tmp_path)
    outputs = tmp_path / "o.npz"
    code, out, err, peak = run_cli(["run", str(evil), "--random", "--outputs", str(outputs)])
    lines = err.strip().splitlines()
    assert code == 2 and lines[0].startswith("error: ") and len(lines) == 2 and lines[1].startswith("  fix: "), err
    for w in words:
        assert w in err, err
    assert not outputs.exists() and list(tmp_path.iterdir()) == [evil]
    assert out == "False", "validation imported torch: a bad file costs seconds and hundreds of MB"
    assert peak < PEAK_MB, f"{peak:.0f} MB"
    code, out, err, _ = run_cli(["inspect", str(evil)])
    assert code == 2 and err.startswith("error: ") and out == "False", err


def test_a_generous_limit_lets_a_trusted_large_plan_through(seeds):
    """The ceiling is the user's: a file's plan beyond the default runs when the user raises it."""
    data = edit(seeds["cpu_fp"], lambda program, plan: plan.non_const_buffer_sizes.__setitem__(1, 3 << 30))
    with pytest.raises(TosakitError, match="3221225472 bytes of arena memory"):
        LoadedProgram(data, "big.pte")
    loaded = LoadedProgram(data, "big.pte", limits=Limits(max_memory=4 << 30))
    assert sum(loaded.layouts["forward"].arena_bytes) < 1 << 20  # only the bytes its tensors use are allocated


def test_backward_jump_must_change_its_condition(seeds):
    def loop(program, plan):
        plan.values.append(S.EValue(S.Bool(False)))
        plan.chains[0].instructions.append(S.Instruction(S.JumpFalseCall(len(plan.values) - 1, 0)))

    with pytest.raises(TosakitError, match="jumps back to 0, but nothing in between changes its condition"):
        LoadedProgram(edit(seeds["cpu_fp"], loop), "loop.pte")


def test_kernel_call_checked_against_its_schema(seeds):
    def wrong_kind(program, plan):
        call = next(i.instr_args for i in plan.chains[0].instructions if isinstance(i.instr_args, S.KernelCall))
        call.args[0] = next(k for k, v in enumerate(plan.values) if isinstance(v.val, S.Int))

    with pytest.raises(TosakitError, match=r"instruction \d+ \(.*\) argument .* is value \d+, a Int, where a Tensor"):
        LoadedProgram(edit(seeds["cpu_fp"], wrong_kind), "kind.pte")


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


def _call_of(plan, kernel: str) -> S.KernelCall:
    index = next(k for k, op in enumerate(plan.operators) if op.name == kernel)
    return next(i.instr_args for i in plan.chains[0].instructions
                if isinstance(i.instr_args, S.KernelCall) and i.instr_args.op_index == index)


def _split_reads_another_tensor(program, plan):
    """Sweep finding: split's input swapped for a tensor of another shape (its outs no longer fit)."""
    call = _call_of(plan, "aten::split_with_sizes_copy")
    call.args[0] = next(k for k, v in enumerate(plan.values) if isinstance(v.val, S.Tensor) and k != call.args[0]
                        and v.val.sizes != plan.values[call.args[0]].val.sizes)


def _split_out_made_a_scalar(program, plan):
    """Sweep finding: one of split's planned outs turned into an unplanned 0-d byte tensor."""
    out = plan.values[_call_of(plan, "aten::split_with_sizes_copy").args[3]].val.items[0]
    plan.values[out] = S.EValue(S.Tensor(scalar_type=S.ScalarType.BYTE, storage_offset=0, sizes=[], dim_order=[],
                                         requires_grad=False, data_buffer_idx=0))


@pytest.mark.parametrize("change", [_split_reads_another_tensor, _split_out_made_a_scalar])
def test_kernel_resizing_its_out_is_one_clean_error(change, seeds, tmp_path, capfd):
    """The mutation sweep's two findings: torch resizes a mismatched out (printing a C++ warning) —
    the run must refuse it naming the call, and print nothing else."""
    from tosakit.cli import main

    evil = tmp_path / "resize.pte"
    evil.write_bytes(edit(seeds["cpu_lists"], change))
    code = main(["run", str(evil), "--random", "--outputs", str(tmp_path / "o.npz")])
    out, err = capfd.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  fix: "), err
    assert "aten::split_with_sizes_copy.out" in lines[0] and not (tmp_path / "o.npz").exists()


@pytest.mark.slow
def test_mutation_sweep(seeds):
    """CI's share of `make fuzz`: damaged copies of every seed program, each in its own process."""
    summary = sweep(sorted(seeds.values()), cases=int(os.environ.get("TOSAKIT_SWEEP_CASES", 450)), jobs=2,
                    progress=False)
    print(report(summary))
    assert summary["seeds"] >= 8 and not summary["problems"], report(summary)
    assert summary["peak_mb"] <= 500


def test_sandbox_runs_only_tosakits_own_handlers():
    """The sandboxed child imports the handler a request names only from tosakit's own stages."""
    from tosakit.runtime.tosa_sandbox import _handler
    from tosakit.verify.npu_ops import serve_call

    assert _handler("tosakit.verify.npu_ops:serve_call") is serve_call
    for name in ("os:system", "subprocess:run", "tosakitx.evil:run"):
        with pytest.raises(TosakitError, match="tosakit's own handlers only"):
            _handler(name)
