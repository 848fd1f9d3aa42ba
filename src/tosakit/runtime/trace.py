"""What a run records for an ETDump, under the names ExecuTorch's runtime gives its events: a "Default" block for
loading ("Method::init" inside "Program::load_method"), then one "Execute" block per run — per kernel call
"native_call_<op>.<overload>" and "OPERATOR_CALL", per delegate call the backend's "<backend>::execute()" and
"DELEGATE_CALL", and "Method::execute" — each keyed by its chain and instruction index. Times are the host's, in
nanoseconds. With ``debug_outputs``, each kernel's output and each delegate call's arguments are logged as debug
events, their bytes in a separate debug buffer, and the program's outputs at the end."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import RAISE_MEMORY_HINT, TosakitError, write_atomic
from ..program import etdump as E
from ..program.schema import ScalarType, scalar_type_of

# the element types ExecuTorch's Inspector reads back from a debug buffer
LOGGED_TYPES = {ScalarType.BYTE, ScalarType.CHAR, ScalarType.BOOL, ScalarType.SHORT, ScalarType.UINT16,
                ScalarType.HALF, ScalarType.INT, ScalarType.FLOAT, ScalarType.DOUBLE, ScalarType.LONG}
ALIGN = 64  # each logged tensor's bytes start at a multiple of this in the debug buffer, as ExecuTorch's do


def now() -> int:
    return time.perf_counter_ns()


def kernel_event_name(operator: str, overload: str) -> str:
    """ExecuTorch's name for a kernel call's event: ``aten::add`` ``out`` -> ``native_call_add.out``."""
    return f"native_call_{operator.split('::')[-1]}" + (f".{overload}" if overload else "")


@dataclass
class EventTracer:
    """The events of a program's runs, written as an ETDump by ``write``; ``max_debug_bytes`` bounds the debug
    buffer."""

    debug_outputs: bool = False
    max_debug_bytes: int = 1 << 30
    runs: list[E.RunData] = field(default_factory=list)
    debug_buffer: bytearray = field(default_factory=bytearray)
    bundled_input_index: int = -1  # the bundled test case that runs next (-1: inputs from elsewhere)

    # ------------------------------------------------------------------ blocks

    def loaded(self, start: int, init: tuple[int, int], end: int) -> None:
        """A method's load (``start`` .. ``end``) with its init (its memory made) inside."""
        self.runs.append(E.RunData("Default", events=[
            _profile("Method::init", -1, 0, *init), _profile("Program::load_method", -1, 0, start, end)]))

    def begin_execute(self) -> None:
        self.runs.append(E.RunData("Execute", self.bundled_input_index, events=[]))

    def end_execute(self, start: int, outputs: list) -> None:
        """Close the block: the program's outputs (with ``debug_outputs``), then "Method::execute"."""
        if self.debug_outputs:
            for out in outputs:
                self._debug(E.UNSET_CHAIN, 0, out, output=True)
        self._events.append(_profile("Method::execute", -1, 0, start, now()))

    # ------------------------------------------------------------------ instructions

    def kernel(self, pc: int, name: str, start: int, call: tuple[int, int], output) -> None:
        """Kernel call ``pc``: the kernel's own time ``call`` inside the instruction's (``start`` .. now)."""
        end = now()
        if self.debug_outputs:
            self._debug(0, pc, output)
        self._events.extend([_profile(name, 0, pc, *call), _profile("OPERATOR_CALL", 0, pc, start, end)])

    def delegate(self, pc: int, backend: str, start: int, call: tuple[int, int], args: list, npu=None) -> None:
        """Delegate call ``pc`` to ``backend``: its execute (``call``) inside the instruction's time; with ``npu``
        (an ``ethosu.profile.NpuProfile``) an event per NPU operation, its delegate debug id the operation's
        number in the stream, placed from the call's start in estimated device time, its figures as metadata."""
        end = now()
        self._events.append(_profile(f"{backend}::execute()", 0, pc, *call))
        if npu is not None:
            ns = 1e9 / npu.system.clock_hz
            for op in npu.operations:
                figures = {"operation": op.operation, "offset": op.offset, "cycles": op.cycles,
                           "estimated": True, **op.counters}
                self._events.append(E.Event(E.ProfileEvent(
                    None, 0, pc, delegate_debug_id_int=op.index,
                    delegate_debug_metadata=json.dumps(figures, separators=(",", ":")).encode(),
                    start_time=call[0] + int(op.start * ns), end_time=call[0] + int(op.end * ns))))
        self._events.append(_profile("DELEGATE_CALL", 0, pc, start, end))
        if self.debug_outputs:
            for a in args:
                self._debug(0, pc, a)

    # ------------------------------------------------------------------ output

    @property
    def _events(self) -> list[E.Event]:
        return self.runs[-1].events

    def _debug(self, chain: int, pc: int, value, output: bool = False) -> None:
        logged = self._value(value)
        if logged is not None:
            if output:
                logged.output = E.Bool(True)
            self._events.append(E.Event(debug_event=E.DebugEvent(chain, pc, logged)))

    def _value(self, value) -> E.Value | None:
        """A value as ExecuTorch logs it (tensors' bytes appended to the debug buffer); None for what it does not
        log."""
        import torch

        if isinstance(value, torch.Tensor):
            kind = scalar_type_of(value.dtype)
            if kind not in LOGGED_TYPES:
                return None
            return E.Value(E.ValueType.TENSOR, tensor=self._tensor(value, kind))
        if isinstance(value, bool):
            return E.Value(E.ValueType.BOOL, bool_value=E.Bool(value))
        if isinstance(value, int):
            return E.Value(E.ValueType.INT, int_value=E.Int(value))
        if isinstance(value, float):
            return E.Value(E.ValueType.DOUBLE, double_value=E.Double(value))
        return None

    def _tensor(self, t, kind: ScalarType) -> E.Tensor:
        t = t.detach().contiguous()
        data = t.numpy().tobytes()
        offset = -(-len(self.debug_buffer) // ALIGN) * ALIGN if data else -1
        if data:
            if offset + len(data) > self.max_debug_bytes:
                raise TosakitError(f"the debug outputs need more than the {self.max_debug_bytes}-byte memory limit",
                                   RAISE_MEMORY_HINT + ", or run without --debug-outputs")
            self.debug_buffer += bytes(offset - len(self.debug_buffer)) + data
        return E.Tensor(kind, list(t.shape), list(t.stride()), offset)

    def etdump(self) -> bytes:
        return E.serialize_etdump(E.ETDump(E.VERSION, self.runs))

    def write(self, path: str | Path, debug_path: str | Path | None = None) -> list[Path]:
        """Write the ETDump (and, with ``debug_path``, the debug buffer); the paths written."""
        written = [write_atomic(path, self.etdump())]
        if debug_path is not None:
            written.append(write_atomic(debug_path, bytes(self.debug_buffer)))
        return written

    def counts(self) -> dict[str, int]:
        """How many profile events of each name the runs recorded."""
        counts: dict[str, int] = {}
        for run in self.runs:
            for e in run.events:
                if e.profile_event is not None:
                    counts[e.profile_event.name] = counts.get(e.profile_event.name, 0) + 1
        return counts


def _profile(name: str, chain: int, pc: int, start: int, end: int) -> E.Event:
    return E.Event(E.ProfileEvent(name, chain, pc, start_time=start, end_time=end))


def event_lines(dump: E.ETDump) -> list[str]:
    """What ``inspect`` says of an ETDump: per block, each profile event (its instruction, its time) and how many
    values were logged."""
    lines = [f"ETDump (version {dump.version}): {len(dump.run_data)} block(s)"]
    for k, run in enumerate(dump.run_data):
        case = f", bundled test case {run.bundled_input_index}" if run.bundled_input_index >= 0 else ""
        debug = sum(1 for e in run.events if e.debug_event is not None)
        lines.append(f"  block {k} {run.name}{case}: {len(run.events) - debug} profile event(s), "
                     f"{debug} logged value(s)")
        for e in run.events:
            p = e.profile_event
            if p is not None:
                delegate = p.delegate_debug_id_str or (str(p.delegate_debug_id_int) if p.delegate_debug_id_int >= 0
                                                       else "")
                name = f"delegate event {delegate}" if delegate else p.name
                lines.append(f"    instruction {p.instruction_id:>4}  {(p.end_time - p.start_time) / 1e3:>10.1f} us"
                             f"  {name}")
    return lines
