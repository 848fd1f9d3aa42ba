"""Running a BundledProgram (.bpte) as ExecuTorch's Arm runner does on the device: every test case of every method,
each output against the one expected (``allclose``: |got - expected| <= atol + rtol * |expected|, 0.01 each by
default), then ``Test_result: PASS`` or ``FAIL``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ..errors import TosakitError
from ..program.bundled import BundledProgramTable, Tensor, deserialize_bundled
from ..program import schema as S
from ..program.schema import ELEMENT_TYPES
from .program import LoadedProgram, read_file
from .validate import Limits

ATOL = RTOL = 0.01  # the Arm runner's defaults (its bundle IO checks)
FAIL_EXIT = 3  # `tosakit run FILE.bpte`'s exit status when a test case fails


@dataclass(frozen=True)
class OutputCheck:
    """One expected output of one test case: how far the program's value is from it."""

    method: str
    case: int
    output: int
    shape: tuple[int, ...]
    max_abs_error: float
    worst_at: tuple[int, ...]  # the element with the largest error beyond the tolerance (or the largest error)
    passed: bool
    step: float | None = None  # the output's quantization step, when a CPU dequantize makes it

    def line(self) -> str:
        verdict = "ok" if self.passed else "FAIL"
        steps = f" ({self.max_abs_error / self.step:.1f} output steps of {self.step:.4g})" \
            if self.step and self.max_abs_error else ""
        return (f"  method {self.method}, test case {self.case}, output {self.output} {list(self.shape)}: "
                f"max |error| {self.max_abs_error:.6g}{steps} at {list(self.worst_at)}: {verdict}")


@dataclass(frozen=True)
class BundledReport:
    """Every check of a bundled program's test cases, and the tolerance they were held to."""

    checks: tuple[OutputCheck, ...]
    atol: float
    rtol: float

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def lines(self) -> list[str]:
        cases = len({(c.method, c.case) for c in self.checks})
        note = []
        if not self.passed and any(c.step for c in self.checks):
            note = ["  (a quantized program's outputs lie whole output steps from a fake-quantized float reference, "
                    "as ExecuTorch's --bundleio bundles it; its Arm tests hold quantized models to atol 0.25 plus one "
                    "output step: --atol)"]
        return [f"{cases} test case(s), {len(self.checks)} output(s), atol {self.atol:g}, rtol {self.rtol:g}:",
                *(c.line() for c in self.checks), *note, f"Test_result: {'PASS' if self.passed else 'FAIL'}"]


def load_bundled(path: str | Path, limits: Limits | None = None, engine: str | None = None
                 ) -> tuple[LoadedProgram, BundledProgramTable]:
    """A .bpte read and checked whole: its program validated as any .pte, its suites against the methods."""
    data, name = read_file(path, limits), str(path)
    try:
        table = deserialize_bundled(data)
    except TosakitError as exc:
        raise TosakitError(f"{name}: {exc.message}", exc.hint) from None
    program = LoadedProgram(table.program, name, limits=limits, engine=engine)
    for suite in table.method_test_suites:
        if suite.method_name not in program.method_names:
            raise TosakitError(f"{name}: a test suite names method {suite.method_name!r}; the program has "
                               f"{', '.join(program.method_names)}", "bundle the suites of the program's methods")
        specs = program.input_specs(suite.method_name)
        for k, case in enumerate(suite.test_cases):
            tensors = [v.val for v in case.inputs if isinstance(v.val, Tensor)]
            shapes = [(ELEMENT_TYPES[t.scalar_type][0], tuple(t.sizes)) for t in tensors]
            wanted = [(str(s.dtype).replace("torch.", ""), tuple(s.shape)) for s in specs]
            if shapes != wanted:
                raise TosakitError(f"{name}: method {suite.method_name!r}, test case {k}: inputs {shapes}, but the "
                                   f"method takes {wanted}", "bundle inputs of the method's types and shapes")
    return program, table


def suite_lines(table: BundledProgramTable) -> list[str]:
    """What ``inspect`` says of a .bpte's test suites."""
    lines = [f"BundledProgram (schema version {table.version}): {len(table.program)}-byte program, "
             f"{len(table.method_test_suites)} test suite(s)"]
    for suite in table.method_test_suites:
        lines.append(f"  method {suite.method_name}: {len(suite.test_cases)} test case(s)")
        for k, case in enumerate(suite.test_cases):
            ins = ", ".join(_describe(v.val) for v in case.inputs)
            outs = ", ".join(_describe(v.val) for v in case.expected_outputs) or "none"
            lines.append(f"    case {k}: inputs {ins}; expected outputs {outs}")
    return lines


def _describe(v) -> str:
    if isinstance(v, Tensor):
        return f"{ELEMENT_TYPES[v.scalar_type][0]}{list(v.sizes)}"
    return repr(getattr(v, next(iter(vars(v)))))


def tensor_of(t: Tensor) -> np.ndarray:
    """A bundled tensor as an array of its logical shape (its bytes are in storage order)."""
    order = t.dim_order or list(range(len(t.sizes)))
    stored = np.frombuffer(t.data, dtype=ELEMENT_TYPES[t.scalar_type][0]).reshape([t.sizes[d] for d in order])
    return stored.transpose(np.argsort(order)).copy()


def check_bundled(program: LoadedProgram, table: BundledProgramTable, atol: float = ATOL,
                  rtol: float = RTOL, tracer=None) -> BundledReport:
    """Run each test case; each expected output against the program's (the runs recorded by ``tracer``, each
    with its test case's index)."""
    import torch

    checks = []
    for suite in table.method_test_suites:
        for k, case in enumerate(suite.test_cases):
            inputs = [torch.from_numpy(tensor_of(v.val)) for v in case.inputs if isinstance(v.val, Tensor)]
            if tracer is not None:
                tracer.bundled_input_index = k
            outputs = program.run(inputs, suite.method_name, tracer)
            expected = [v.val for v in case.expected_outputs if isinstance(v.val, Tensor)]
            if len(expected) > len(outputs):
                raise TosakitError(f"{program.name}: method {suite.method_name!r}, test case {k} expects "
                                   f"{len(expected)} outputs; the method gives {len(outputs)}",
                                   "bundle the outputs the method returns")
            steps = output_steps(program.plan(suite.method_name))
            for i, (got, want) in enumerate(zip(outputs, expected)):
                check = _compare(suite.method_name, k, i, got.numpy(), tensor_of(want), atol, rtol)
                checks.append(replace(check, step=steps[i]))
    return BundledReport(tuple(checks), atol, rtol)


def output_steps(plan: S.ExecutionPlan) -> list[float | None]:
    """Each output's quantization step when a per-tensor dequantize kernel writes it (the scale it reads), else
    None: an integer program differs from a fake-quantized reference by whole steps of it."""
    steps: dict[int, float] = {}
    for instruction in plan.chains[0].instructions if plan.chains else []:
        call = instruction.instr_args
        if isinstance(call, S.KernelCall) and \
                plan.operators[call.op_index].name == "quantized_decomposed::dequantize_per_tensor":
            scale = plan.values[call.args[1]].val
            if isinstance(scale, S.Double):
                steps[call.args[-1]] = scale.double_val
    return [steps.get(i) for i in plan.outputs]


def _compare(method: str, case: int, output: int, got: np.ndarray, want: np.ndarray, atol: float,
             rtol: float) -> OutputCheck:
    if got.shape != want.shape:
        return OutputCheck(method, case, output, tuple(want.shape), float("inf"), (), False)
    g, w = got.astype(np.float64), want.astype(np.float64)
    error = np.abs(g - w)
    beyond = error - (atol + rtol * np.abs(w))
    worst = np.unravel_index(int(np.argmax(beyond)), w.shape) if w.size else ()
    return OutputCheck(method, case, output, tuple(w.shape), float(error.max()) if w.size else 0.0,
                       tuple(int(i) for i in worst), not w.size or bool((beyond <= 0).all()))
