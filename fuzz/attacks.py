"""The hand-made attacks of the untrusted-.pte issue, as edits of a valid program: what the tests assert
is refused and `bench/run.py hostile` times."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from tosakit.program import schema as S
from tosakit.program.pte import deserialize_pte, serialize_pte


def edit(path: Path, change) -> bytes:
    """The program at ``path`` with ``change(program, plan)`` applied to its forward method."""
    program, segments = deserialize_pte(path.read_bytes())
    change(program, program.execution_plan[0])
    return serialize_pte(program, segments)


def foreign_operator(name, overload):
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
    "from_file": ("cpu_fp", foreign_operator("aten::from_file", "out"), ["aten::from_file.out", "not an ExecuTorch"]),
    "not_a_kernel": ("cpu_int", foreign_operator("aten::_foreach_add", "List"), ["aten::_foreach_add.List"]),
    "self_jump": ("cpu_fp", _self_jump, ["instruction 0 jumps to itself"]),
    "arena_1tb": ("cpu_fp", _huge_arena, ["1099511627776 bytes", "--max-memory"]),
    "input_2gb": ("cpu_fp", _huge_input, ["claims [1, 536870912] FLOAT", "--max-memory"]),
    "damaged_tosa": ("tosa_fp", _damaged_tosa, ["TOSA graph", "TOSABackend"]),
}


def write(name: str, seeds: dict[str, Path], folder: Path) -> Path:
    """The attack ``name`` applied to its seed program, written to ``folder``."""
    seed, change, _ = REPRODUCERS[name]
    path = folder / f"{name}.pte"
    path.write_bytes(edit(seeds[seed], change))
    return path


def run_cli(argv: list[str]) -> tuple[int, str, str, float]:
    """`tosakit` in a fresh process: exit status, whether torch got imported ('True'/'False'), stderr, peak
    resident MB (VmHWM, which a fork-and-exec does not inherit from its parent, unlike ru_maxrss)."""
    code = ("import re, sys; from tosakit.cli import main; rc = main(sys.argv[1:]); "
            "hwm = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1); "
            "print('torch' in sys.modules, hwm); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    imported, hwm_kb = proc.stdout.split()[-2:]
    return proc.returncode, imported, proc.stderr, int(hwm_kb) / 1024
