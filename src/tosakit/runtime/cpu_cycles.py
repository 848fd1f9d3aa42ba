"""Where a program's CPU time goes on a Cortex-M core: each kernel call's estimated cycles (the Cortex-M cost
rules, ``backends.cortex_m.cycles``), read from the program's values without running it, and the total."""

from __future__ import annotations

from dataclasses import dataclass

from ..backends.cortex_m.cycles import Board, Estimate, Tensor, board_for, estimate, portable_elementwise
from ..program import schema as S
from ..program.kernels import kernel_key, kernel_schemas
from ..targets import CORTEX_M_ISA

DEFAULT_CORE = "cortex-m55"  # Corstone-300's core, beside an Ethos-U55


def core_for(target: str, fallback: str | None = None) -> str:
    """The core a program's CPU kernels run on: the target itself, the Ethos-U fallback's core, or a Cortex-M55."""
    return target if target in CORTEX_M_ISA else fallback or DEFAULT_CORE


@dataclass(frozen=True)
class KernelCycles:
    """One kernel call: its instruction index, kernel, and estimate (None: no rule for this kernel)."""

    index: int
    kernel: str
    estimate: Estimate | None


@dataclass(frozen=True)
class CpuCycles:
    """A method's kernel calls on ``core``: per call, and the total of those with an estimate."""

    method: str
    core: str
    board: Board
    calls: tuple[KernelCycles, ...]

    @property
    def total(self) -> int:
        return sum(c.estimate.cycles for c in self.calls if c.estimate is not None)

    @property
    def unknown(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c.kernel for c in self.calls if c.estimate is None))

    def milliseconds(self, cycles: int) -> float:
        return 1e3 * cycles / self.board.clock_hz

    def as_dict(self) -> dict:
        return {"method": self.method, "core": self.core, "board": self.board.name, "total_cycles": self.total,
                "milliseconds": round(self.milliseconds(self.total), 4), "without_estimate": list(self.unknown),
                "calls": [{"instruction": c.index, "kernel": c.kernel,
                           **({} if c.estimate is None else vars(c.estimate))} for c in self.calls]}

    def summary(self) -> str:
        """One line: the total on the core, at the board's clock."""
        missing = f" (without {', '.join(self.unknown)})" if self.unknown else ""
        return (f"CPU kernels of {self.method} on {self.core}: {self.total:,} cycles estimated, "
                f"{self.milliseconds(self.total):.2f} ms at {self.board.clock_hz / 1e6:.0f} MHz{missing}")

    def lines(self) -> list[str]:
        """The table ``inspect`` prints: a line per call, then the total at the board's clock."""
        clock = f"{self.board.clock_hz / 1e6:.0f} MHz"
        out = [f"CPU kernels on {self.core} (estimated cycles; {self.board.name}):"]
        for c in self.calls:
            e = c.estimate
            cost = "no estimate for this kernel" if e is None else \
                f"{e.cycles:>11,} cycles  {e.function}" + (f", {e.macs:,} MACs" if e.macs else "")
            out.append(f"  [{c.index:>3}] {c.kernel:<46} {cost}")
        missing = f"; without {len(self.unknown)} kernel(s) it has no rule for" if self.unknown else ""
        out.append(f"  total: {self.total:,} cycles, {self.milliseconds(self.total):.2f} ms at {clock}{missing}")
        return out


def _argument(plan: S.ExecutionPlan, index: int):
    """What a cost rule reads of a value: a Tensor's shape and element size, an int, a list of ints, or None."""
    val = plan.values[index].val
    if isinstance(val, S.Tensor):
        return Tensor(tuple(val.sizes), S.ELEMENT_TYPES[val.scalar_type][1])
    if isinstance(val, (S.Int, S.Bool, S.Double)):
        return getattr(val, {"Int": "int_val", "Bool": "bool_val", "Double": "double_val"}[type(val).__name__])
    if isinstance(val, S.IntList):
        return tuple(plan.values[i].val.int_val for i in val.items)
    return None


def cpu_cycles(plan: S.ExecutionPlan, core: str = DEFAULT_CORE, board: Board | None = None) -> CpuCycles:
    """Each kernel call of a validated method's plan, estimated for ``core`` (a name in ``CORTEX_M_ISA``) on
    ``board`` (default: the core's, ``board_for``)."""
    isa, schemas, calls, board = CORTEX_M_ISA[core], kernel_schemas(), [], board or board_for(core)
    instructions = plan.chains[0].instructions if plan.chains else []
    for k, instruction in enumerate(instructions):
        call = instruction.instr_args
        if not isinstance(call, S.KernelCall):
            continue
        op = plan.operators[call.op_index]
        key = kernel_key(op.name, op.overload)
        schema = schemas.get(key)
        args = {} if schema is None else {a.name: _argument(plan, i) for a, i in zip(schema.args, call.args)}
        found = estimate(key, args, isa, board) if schema is not None else None
        if found is None and schema is not None and not key.startswith("cortex_m::"):
            found = portable_elementwise(key, args, isa)
        calls.append(KernelCycles(k, key, found))
    return CpuCycles(plan.name, core, board, tuple(calls))
