"""The host runtime's entry: a .pte (ours or ExecuTorch's, from anywhere) read and validated whole, then
run with ExecuTorch's CPU kernels (as PyTorch implements them), Ethos-U delegates on the command-stream simulator
(Ethos-U55, U65 and U85) and other delegates on the TOSA reference model."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..errors import RAISE_MEMORY_HINT, TosakitError
from ..program import schema as S
from ..program.bundled import is_bundled
from ..program.pte import deserialize_pte, tosa_key
from ..program.ptd import NamedBlob, deserialize_ptd
from .records import EngineComparison, NpuCall, TensorSpec
from .validate import Limits, MethodLayout, check_engine, data_map, delegate_payload, validate

DEBUG_INFO_FIX = "recompile with `tosakit compile ... --debug-info` (Python: compile_spec.with_debug_info())"


class LoadedProgram:
    """A .pte checked and ready to run: ``run([tensors]) -> [tensors]``.

    ``engine`` is how Ethos-U delegates run: "npu" on the command-stream simulator (Ethos-U55, U65, U85), "tosa" from
    the TOSA they carry (--debug-info) on the reference model; by default (None) the simulator whenever it runs
    the stream, else the TOSA. Other delegates always run their TOSA. ``isolate`` runs delegates' TOSA in a
    child process (for files from anywhere); tosakit's own fresh programs may run it in this process."""

    def __init__(self, data: bytes, name: str = "<bytes>", tosa: dict[str, bytes] | None = None,
                 limits: Limits | None = None, isolate: bool = True, engine: str | None = None,
                 named_data: dict[str, NamedBlob] | None = None):
        check_engine(engine)
        self.name, self.limits, self.isolate, self.engine = name, limits or Limits(), isolate, engine
        try:
            self.program, self.segments = deserialize_pte(data)
        except TosakitError as exc:
            hint = ("it is a BundledProgram (.bpte): `tosakit run` checks its test cases, `runtime.load_bundled` "
                    "reads it") if is_bundled(data) else exc.hint
            raise TosakitError(f"{name}: {exc.message}", hint) from None
        self.named = data_map(self.program, self.segments, named_data)  # a .ptd's entries, then the program's
        self._tosa = dict(tosa or {})
        for key, blob in self.named.items():
            self._tosa.setdefault(key, blob.data)
        self.layouts: dict[str, MethodLayout] = validate(self.program, self.segments, self._tosa, self.limits, name,
                                                         engine, self.named)
        self._arenas: dict[str, list] = {}
        self._shared: dict = {}
        self._children: dict = {}  # "vgf", or a sandbox's address-space cap -> the child process kept for it

    # -------------------------------------------------------------- description

    @property
    def method_names(self) -> list[str]:
        return [p.name for p in self.program.execution_plan]

    def plan(self, method: str = "forward") -> S.ExecutionPlan:
        for p in self.program.execution_plan:
            if p.name == method:
                return p
        raise TosakitError(f"{self.name} has no method {method!r}", f"its methods: {', '.join(self.method_names)}")

    def input_specs(self, method: str = "forward") -> list[TensorSpec]:
        plan = self.plan(method)
        return [self._spec(plan.values[i].val) for i in plan.inputs]

    def output_specs(self, method: str = "forward") -> list[TensorSpec]:
        plan = self.plan(method)
        return [self._spec(plan.values[i].val) for i in plan.outputs]

    @staticmethod
    def _spec(t: S.Tensor) -> TensorSpec:
        return TensorSpec(t.scalar_type, tuple(t.sizes))

    def delegate_payload(self, delegate: S.BackendDelegate) -> bytes:
        return delegate_payload(self.program, self.segments, delegate, self.named)

    def carries_tosa(self, delegate: S.BackendDelegate) -> bool:
        """Whether the host can run ``delegate``: a TOSA delegate, or one whose TOSA is carried (--debug-info)."""
        return delegate.id == "TOSABackend" or tosa_key(self.delegate_payload(delegate)) in self._tosa

    def no_tosa(self, delegate: S.BackendDelegate, index: int) -> TosakitError:
        """Why delegate ``index`` cannot run on the host: it must run its TOSA, and the program carries none."""
        if delegate.id == "VgfBackend":
            from .vgf.stack import gaps_text, missing

            gaps = missing()
            why = " (engine 'tosa')"
            if gaps:
                what, how = gaps_text(gaps)
                why = f", and this machine lacks the VGF engine's {what} ({how})"
        elif delegate.id != "EthosUBackend":
            why = ", so it cannot run on the host"
        elif self.engine == "tosa":
            why = " for the tosa engine to run"
        else:
            why = (", and its Ethos-U85 command stream uses what the simulator does not run yet "
                   "(`tosakit inspect --commands` lists it)")
        return TosakitError(f"{self.name}: delegate {index} ({delegate.id}) has no TOSA graph inside the program{why}",
                            DEBUG_INFO_FIX)

    # -------------------------------------------------------------- execution

    def arenas(self, method: str) -> list:
        """``method``'s planned memory, made on its first run and kept, as ExecuTorch keeps a loaded method's: its
        state (mutable buffers) carries from one run to the next, and arena 2's from method to method, as in a
        runner that loads every method before it runs one (ExecuTorch writes a method's initial state when it
        loads it)."""
        if method not in self._arenas:
            from .execute import new_arenas

            self._arenas[method] = new_arenas(self, self.layouts[method], self._shared)
        return self._arenas[method]

    def vgf_engine(self, deadline: float):
        """The child process running this program's VGF delegates (each VGF file's pipeline built once)."""
        from .vgf import VgfEngine, find_stack

        return self._kept("vgf", lambda: VgfEngine(find_stack(), deadline), deadline)

    def sandbox(self, max_memory: int, deadline: float):
        """The child process running this file's TOSA graphs and Ethos-U payloads under a ``max_memory`` address
        space."""
        from .tosa_sandbox import IsolatedReferenceModel

        return self._kept(max_memory, lambda: IsolatedReferenceModel(max_memory, deadline), deadline)

    def _kept(self, key, start: Callable, deadline: float):
        """The program's child process ``key``: started on first use, kept across runs (a new one after a crash or a
        time-out), its deadline the current run's."""
        child = self._children.get(key)
        if child is None or child.proc.poll() is not None:
            child = self._children[key] = start()
        child.deadline = deadline
        return child

    def run(self, inputs, method: str = "forward", tracer=None) -> list:
        """Execute ``method`` on ``inputs`` (torch tensors or numpy arrays); returns new torch tensors. A
        ``trace.EventTracer`` records the run's events."""
        from .execute import Execution

        return Execution(self, self.plan(method), self.layouts[method], tracer=tracer).run(list(inputs))

    def run_profiled(self, inputs, method: str = "forward", tracer=None) -> tuple[list, list]:
        """``run``, each instruction timed and each simulated Ethos-U delegate call's NPU operations estimated:
        the outputs and the steps (``records.Step``; ``profile.program_profile`` makes them a timeline)."""
        from .execute import Execution

        execution = Execution(self, self.plan(method), self.layouts[method], tracer=tracer, profile=True)
        return execution.run(list(inputs)), execution.steps

    def run_and_compare(self, inputs, method: str = "forward") -> tuple[list, list[EngineComparison]]:
        """``run``, with each Ethos-U delegate that runs on the simulator, and each VGF delegate that runs on the VGF
        engine, when it carries its TOSA also run on the reference model, on the same inputs: the outputs, and how
        each delegate output compares."""
        outputs, comparisons, _ = self.run_and_check(inputs, None, method)
        return outputs, comparisons

    def run_and_check(self, inputs, per_operation: Callable[[NpuCall], list] | None,
                      method: str = "forward") -> tuple[list, list[EngineComparison], list]:
        """``run_and_compare``, each such delegate call also handed, in the same run, to ``per_operation`` (a
        check of a later stage): the outputs, the comparisons and what ``per_operation`` found, in order."""
        from .execute import Execution

        self._comparable(method)
        execution = Execution(self, self.plan(method), self.layouts[method], compare=True, per_operation=per_operation)
        return execution.run(list(inputs)), execution.comparisons, execution.findings

    def _comparable(self, method: str) -> None:
        """Some delegate of ``method`` runs on the simulator and carries its TOSA, else an error saying why not."""
        layout = self.layouts[method]
        if not (layout.delegate_npu.keys() | layout.delegate_vgf.keys()) & layout.delegate_tosa.keys():
            if layout.delegate_npu:
                raise TosakitError(f"{self.name}: its Ethos-U delegates carry no TOSA to compare the simulator's "
                                   f"results with", DEBUG_INFO_FIX)
            raise TosakitError(f"{self.name}: no delegate of method {method!r} runs on the Ethos-U simulator or the "
                               "VGF engine" + (" (engine 'tosa')" if self.engine == "tosa" else ""),
                               "comparing the engines needs a delegate the npu or vgf engine runs")


def read_file(path: str | Path, limits: Limits | None = None, kind: str = ".pte") -> bytes:
    """A ``kind`` file's bytes (.pte, .ptd, ...), refused when missing or larger than the memory limit."""
    path = Path(path)
    if not path.is_file():
        raise TosakitError(f"{path} not found" if not path.exists() else f"{path} is not a file",
                           f"give the path of a {kind} file")
    limits = limits or Limits()
    size = path.stat().st_size
    if size > limits.max_memory:
        raise TosakitError(f"{path} is {size} bytes, more than the {limits.max_memory}-byte memory limit",
                           RAISE_MEMORY_HINT)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TosakitError(f"cannot read {path}: {exc.strerror}", "check the path and its permissions") from None


def load(path: str | Path, tosa: dict[str, bytes] | None = None, limits: Limits | None = None,
         engine: str | None = None, data: str | Path | None = None) -> LoadedProgram:
    """Read and validate a .pte for running on the host, Ethos-U delegates on ``engine`` (see LoadedProgram), its
    named data from the .ptd file ``data`` too."""
    return LoadedProgram(read_file(path, limits), str(path), tosa, limits, engine=engine,
                         named_data=read_data(data, limits) if data is not None else None)


def read_data(path: str | Path, limits: Limits | None = None) -> dict[str, NamedBlob]:
    """A named-data file's entries (.ptd), read and checked whole."""
    data = read_file(path, limits, ".ptd")
    try:
        return deserialize_ptd(data)
    except TosakitError as exc:
        raise TosakitError(f"{path}: {exc.message}", exc.hint) from None
