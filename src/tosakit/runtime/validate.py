"""A .pte from anywhere, checked whole before anything runs (ExecuTorch's ``InternalConsistency``
verification, always on, and more): every index in range, every value of the kind its use needs, only
the ExecuTorch CPU kernels with their schemas, tensors inside their arenas, jumps that terminate, memory
within what the file's plan states and the user's ceiling, delegate payloads parsed and their TOSA
checked before native code reads it, Ethos-U command streams decoded. Imports no torch: a bad file is refused in
a fraction of a second."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..backends.ethosu.payload import EthosUPayload, inline_external, parse_payload
from ..errors import RAISE_MEMORY_HINT, TosakitError, did_you_mean
from ..program import schema as S
from ..program.kernels import KernelSchema, kernel_key, kernel_schemas
from ..program.pte import tosa_key
from ..program.ptd import NamedBlob
from .ethosu.commands import NotSimulatedError, decode
from .ethosu.simulate import FAST_SCRATCH_BYTES, memory_needed, require_simulated
from .tosa_validate import TosaSummary, check_tosa
from .vgf.container import VgfContainer, parse_vgf
from .vgf import stack as vgf_stack

FIX = "the file is damaged or was not written for ExecuTorch's runtime: re-export the model"
HOST_DELEGATES = ("TOSABackend", "EthosUBackend", "VgfBackend")
# How a delegate runs on the host. Ethos-U: its command stream on the simulator ("npu"), or its carried TOSA on
# the reference model ("tosa"); by default the simulator for the streams it runs, TOSA for the others. VGF: its
# payload on Arm's ML SDK stack ("vgf"), or its carried TOSA ("tosa"); by default the stack when this machine
# has it, else the TOSA.
ENGINES = ("npu", "tosa", "vgf")
MAX_RANK = 16
# element types the host runtime computes with (quantized and float8 storage types are not kernel inputs)
RUNNABLE = {S.ScalarType.BYTE, S.ScalarType.CHAR, S.ScalarType.SHORT, S.ScalarType.INT, S.ScalarType.LONG,
            S.ScalarType.HALF, S.ScalarType.FLOAT, S.ScalarType.DOUBLE, S.ScalarType.BOOL, S.ScalarType.BFLOAT16,
            S.ScalarType.UINT16, S.ScalarType.UINT32, S.ScalarType.UINT64}
# TOSA DType -> the program scalar type its delegate I/O must have
TOSA_IO_TYPES = {"BOOL": S.ScalarType.BOOL, "INT8": S.ScalarType.CHAR, "INT16": S.ScalarType.SHORT,
                 "INT32": S.ScalarType.INT, "INT64": S.ScalarType.LONG, "FP32": S.ScalarType.FLOAT,
                 "FP16": S.ScalarType.HALF, "BF16": S.ScalarType.BFLOAT16}


@dataclass(frozen=True)
class Limits:
    """What a program from a file may claim (``tosakit run --max-memory --timeout``)."""

    max_memory: int = 1 << 30  # bytes: arenas in use, unplanned tensors, a delegate's TOSA tensors or NPU regions
    timeout: float = 600.0  # seconds for one run
    max_steps: int = 10_000_000  # instructions executed in one run (loops)


@dataclass
class MethodLayout:
    """What validation learned about a method, for running it: arena bytes in use, the state its arenas start
    with, each delegate's TOSA and the Ethos-U delegates that run on the simulator."""

    arena_bytes: list[int]
    initial: list[tuple[int, int, int, int, int]] = field(default_factory=list)  # arena, offset, segment, at, bytes
    delegate_tosa: dict[int, tuple[bytes, TosaSummary]] = field(default_factory=dict)  # checked graph, its I/O
    delegate_npu: dict[int, EthosUPayload] = field(default_factory=dict)  # payloads whose stream decodes
    delegate_vgf: dict[int, VgfContainer] = field(default_factory=dict)  # VGF payloads the VGF engine runs
    memory: int = 0


def tensor_nbytes(t: S.Tensor) -> int:
    return math.prod(t.sizes) * S.ELEMENT_TYPES[t.scalar_type][1]


class _Method:
    """Checks one execution plan; every error names the method and the value or instruction."""

    def __init__(self, plan: S.ExecutionPlan, program: S.Program, segments: list[bytes], tosa: dict[str, bytes],
                 limits: Limits, name: str, engine: str | None, named: dict[str, NamedBlob]):
        self.plan, self.program, self.segments, self.tosa, self.limits = plan, program, segments, tosa, limits
        self.named = named
        self.engine = engine
        self.where = f"{name}: method {plan.name!r}"
        self.values = plan.values
        self.constants: set[int] = set()

    def fail(self, message: str, hint: str = FIX) -> TosakitError:
        return TosakitError(f"{self.where}: {message}", hint)

    def kind(self, index: int) -> str:
        return type(self.values[index].val).__name__

    def index(self, i: int, what: str) -> int:
        if not 0 <= i < len(self.values):
            raise self.fail(f"{what} refers to value {i}, but the method has {len(self.values)} values")
        return i

    def expect(self, i: int, kinds: tuple[str, ...], what: str) -> None:
        self.index(i, what)
        if self.kind(i) not in kinds:
            raise self.fail(f"{what} is value {i}, a {self.kind(i)}, where a {' or '.join(kinds)} is needed")

    # ------------------------------------------------------------------ values

    def check(self) -> MethodLayout:
        plan = self.plan
        arenas = list(plan.non_const_buffer_sizes)
        if any(n < 0 for n in arenas):
            raise self.fail(f"plans arenas of {arenas[:8]} bytes")
        if sum(arenas[1:]) > self.limits.max_memory:
            raise self.fail(f"plans {sum(arenas[1:])} bytes of arena memory ({len(arenas) - 1} arena(s)), more than "
                            f"the {self.limits.max_memory}-byte limit",
                            RAISE_MEMORY_HINT)
        layout = MethodLayout(arena_bytes=[0] * max(len(arenas), 1))
        unplanned = 0
        for i, ev in enumerate(self.values):
            val = ev.val
            if isinstance(val, S.Tensor):
                unplanned += self.tensor(i, val, arenas, layout)
            elif isinstance(val, (S.IntList, S.TensorList, S.OptionalTensorList)):
                member = {"IntList": ("Int",), "TensorList": ("Tensor",),
                          "OptionalTensorList": ("Tensor", "Null")}[type(val).__name__]
                for j in val.items:
                    if not (isinstance(val, S.OptionalTensorList) and j == -1):
                        self.expect(j, member, f"member of {type(val).__name__} value {i}")
        layout.memory = sum(layout.arena_bytes) + unplanned
        if layout.memory > self.limits.max_memory:
            raise self.fail(f"needs {layout.memory} bytes of memory, more than the {self.limits.max_memory}-byte "
                            f"limit", RAISE_MEMORY_HINT)
        for k, i in enumerate(plan.inputs):
            self.expect(i, ("Tensor",), f"input {k}")
            if i in self.constants:
                raise self.fail(f"input {k} is value {i}, a constant")
        for k, i in enumerate(plan.outputs):
            self.expect(i, ("Tensor",), f"output {k}")
        self.operators = self.kernels()
        self.instructions(layout)
        return layout

    def tensor(self, i: int, t: S.Tensor, arenas: list[int], layout: MethodLayout) -> int:
        """Check a tensor value; its bytes when neither constant nor planned (allocated at run time). A planned
        tensor with data is state (a mutable buffer): its initial bytes are in a mutable data segment."""
        what = f"value {i}"
        if t.scalar_type not in RUNNABLE:
            raise self.fail(f"{what} is a tensor of {t.scalar_type.name}, which no CPU kernel computes with")
        if len(t.sizes) > MAX_RANK or any(not 0 <= d < 2 ** 31 for d in t.sizes):
            raise self.fail(f"{what} has sizes {list(t.sizes)[:MAX_RANK + 1]}")
        if t.dim_order and sorted(t.dim_order) != list(range(len(t.sizes))):
            raise self.fail(f"{what} has dim order {list(t.dim_order)}, not a permutation of its {len(t.sizes)} dims")
        nbytes = tensor_nbytes(t)
        if t.extra_tensor_info is not None and t.extra_tensor_info.location != S.TensorDataLocation.SEGMENT:
            return self.external(i, t)
        if nbytes > self.limits.max_memory:
            raise self.fail(f"{what} claims {list(t.sizes)} {t.scalar_type.name}, {nbytes} bytes, more than the "
                            f"{self.limits.max_memory}-byte memory limit",
                            RAISE_MEMORY_HINT)
        if t.data_buffer_idx > 0 and t.allocation_info is None:
            return self.constant(i, t, nbytes)
        if t.allocation_info is None:
            return nbytes
        a = t.allocation_info
        offset = a.memory_offset_low | (a.memory_offset_high << 32)
        if not 0 < a.memory_id < len(arenas):
            raise self.fail(f"{what} is planned in arena {a.memory_id}, but the method has arenas "
                            f"1..{len(arenas) - 1}")
        if offset + nbytes > arenas[a.memory_id]:
            raise self.fail(f"{what} ({nbytes} bytes at offset {offset}) runs past the end of arena "
                            f"{a.memory_id} ({arenas[a.memory_id]} bytes)")
        if offset % S.ELEMENT_TYPES[t.scalar_type][1]:
            raise self.fail(f"{what} at offset {offset} of arena {a.memory_id} is not aligned to its "
                            f"{S.ELEMENT_TYPES[t.scalar_type][1]}-byte elements")
        layout.arena_bytes[a.memory_id] = max(layout.arena_bytes[a.memory_id], offset + nbytes)
        if t.data_buffer_idx > 0:
            layout.initial.append((a.memory_id, offset, *self.initial_data(i, t, nbytes)))
        return 0

    def external(self, i: int, t: S.Tensor) -> int:
        """A constant kept in a data file (.ptd) by name: there, with the tensor's type, sizes and dim order."""
        what, key = f"value {i}", t.extra_tensor_info.fully_qualified_name
        if t.extra_tensor_info.location != S.TensorDataLocation.EXTERNAL or t.allocation_info is not None:
            raise self.fail(f"{what} is planned memory filled from a data file, which the host runtime does not load")
        blob = self.named.get(key) if key else None
        if blob is None or blob.layout is None:
            raise self.fail(f"{what} reads constant {key!r} from a data file, and no data file given holds it"
                            + (" as a tensor" if blob is not None else ""),
                            "pass the program's named-data file: tosakit run X.pte --data X.ptd")
        layout, order = blob.layout, list(t.dim_order) or list(range(len(t.sizes)))
        if (layout.scalar_type, list(layout.sizes), list(layout.dim_order)) != (t.scalar_type, list(t.sizes), order):
            raise self.fail(f"{what} is {t.scalar_type.name}{list(t.sizes)} in dim order {order}; the data file's "
                            f"{key!r} is {layout.scalar_type.name}{list(layout.sizes)} in dim order "
                            f"{list(layout.dim_order)}", "pass the data file written with this program")
        self.constants.add(i)
        return 0

    def initial_data(self, i: int, t: S.Tensor, nbytes: int) -> tuple[int, int, int]:
        """Where state value ``i`` starts from: (segment, offset, bytes) inside a mutable data segment."""
        which = t.extra_tensor_info.mutable_data_segments_idx if t.extra_tensor_info is not None else 0
        tables = self.program.mutable_data_segments or []
        if which >= len(tables):
            raise self.fail(f"value {i} is state whose initial data is in mutable data segment {which}, but the "
                            f"program has {len(tables)}")
        table = tables[which]
        if not 0 <= table.segment_index < len(self.segments):
            raise self.fail(f"mutable data segment {which} is segment {table.segment_index}, but the file has "
                            f"{len(self.segments)}")
        if t.data_buffer_idx >= len(table.offsets):
            raise self.fail(f"value {i} starts from buffer {t.data_buffer_idx} of mutable data segment {which}, "
                            f"which has {len(table.offsets) - 1}")
        at, size = table.offsets[t.data_buffer_idx], len(self.segments[table.segment_index])
        if at + nbytes > size:
            raise self.fail(f"value {i} reads {nbytes} bytes of initial data at offset {at}, past the {size}-byte "
                            f"mutable data segment {which}")
        return table.segment_index, at, nbytes

    def constant(self, i: int, t: S.Tensor, nbytes: int) -> int:
        seg = self.program.constant_segment
        offsets = seg.offsets if seg else [0]
        if t.data_buffer_idx >= len(offsets):
            raise self.fail(f"value {i} reads constant {t.data_buffer_idx}, but the program has {len(offsets) - 1}")
        data = len(self.segments[seg.segment_index]) if seg else 0
        if offsets[t.data_buffer_idx] + nbytes > data:
            raise self.fail(f"value {i} reads {nbytes} bytes of constant {t.data_buffer_idx} at offset "
                            f"{offsets[t.data_buffer_idx]}, past the {data}-byte constant segment")
        self.constants.add(i)
        return 0

    # ------------------------------------------------------------------ kernels and instructions

    def kernels(self) -> list[KernelSchema]:
        known = kernel_schemas()
        found = []
        for k, op in enumerate(self.plan.operators):
            key = kernel_key(op.name, op.overload)
            if key not in known:
                raise self.fail(f"operator {k} is {key}, which is not an ExecuTorch CPU kernel: the runtime "
                                f"runs only the {len(known)} kernels ExecuTorch registers",
                                "a program naming other operators was not made by ExecuTorch or tosakit; "
                                "do not run it")
            found.append(known[key])
        return found

    def instructions(self, layout: MethodLayout) -> None:
        chains = self.plan.chains
        if len(chains) > 1:
            raise self.fail(f"has {len(chains)} chains; ExecuTorch programs run one")
        instructions = chains[0].instructions if chains else []
        written: list[set[int]] = []
        for pc, ins in enumerate(instructions):
            args = ins.instr_args
            what = f"instruction {pc}"
            if isinstance(args, S.KernelCall):
                written.append(self.kernel_call(pc, args))
            elif isinstance(args, S.DelegateCall):
                written.append(self.delegate_call(pc, args, layout))
            elif isinstance(args, S.MoveCall):
                self.index(args.move_from, f"{what} (move)")
                self.expect(args.move_to, (self.kind(args.move_from),), f"{what} (move) target")
                written.append({args.move_to})
            elif isinstance(args, S.JumpFalseCall):
                self.expect(args.cond_value_index, ("Bool", "Tensor"), f"{what} (jump) condition")
                written.append(set())
            elif isinstance(args, S.FreeCall):
                self.expect(args.value_index, ("Tensor",), f"{what} (free)")
                written.append(set())
        for pc, ins in enumerate(instructions):
            if isinstance(ins.instr_args, S.JumpFalseCall):
                self.jump(pc, ins.instr_args, len(instructions), written)

    def jump(self, pc: int, jump: S.JumpFalseCall, count: int, written: list[set[int]]) -> None:
        """Forward jumps always end; a backward one only if its loop writes the condition it tests."""
        dest = jump.destination_instruction
        if not 0 <= dest <= count:
            raise self.fail(f"instruction {pc} jumps to {dest}, outside the {count} instructions")
        if dest == pc:
            raise self.fail(f"instruction {pc} jumps to itself: the method would never return")
        if dest < pc and not any(jump.cond_value_index in w for w in written[dest:pc]):
            raise self.fail(f"instruction {pc} jumps back to {dest}, but nothing in between changes its condition "
                            f"(value {jump.cond_value_index}): the method would never return")

    def kernel_call(self, pc: int, call: S.KernelCall) -> set[int]:
        if not 0 <= call.op_index < len(self.operators):
            raise self.fail(f"instruction {pc} calls operator {call.op_index}, but there are {len(self.operators)}")
        schema = self.operators[call.op_index]
        what = f"instruction {pc} ({schema.key})"
        if len(call.args) != len(schema.args) + 1:
            raise self.fail(f"{what} passes {len(call.args)} values; its schema takes {len(schema.args)} "
                            f"arguments and a return value")
        written = set()
        for arg, i in zip(schema.args, call.args):
            self.expect(i, arg.kinds(), f"{what} argument {arg.name!r}")
            val = self.values[i].val
            if arg.base == "ScalarType" and isinstance(val, S.Int) and val.int_val not in S.ELEMENT_TYPES:
                raise self.fail(f"{what} argument {arg.name!r} is {val.int_val}, not a scalar type")
            if arg.is_out:
                targets = list(val.items) if isinstance(val, S.TensorList) else [i]
                if any(t in self.constants for t in targets):
                    raise self.fail(f"{what} writes its {arg.name!r} into a constant")
                written.update(targets)
        self.expect(call.args[-1], schema.return_kinds, f"{what} return value")
        return written | {call.args[-1]}

    def delegate_call(self, pc: int, call: S.DelegateCall, layout: MethodLayout) -> set[int]:
        delegates = self.plan.delegates
        if not 0 <= call.delegate_index < len(delegates):
            raise self.fail(f"instruction {pc} calls delegate {call.delegate_index}, but there are {len(delegates)}")
        delegate = delegates[call.delegate_index]
        what = f"instruction {pc} (delegate {call.delegate_index}, {delegate.id})"
        if delegate.id not in HOST_DELEGATES:
            raise self.fail(f"{what}: the host runtime runs {', '.join(HOST_DELEGATES)} delegates",
                            "run this program on the device it was built for")
        for k, i in enumerate(call.args):
            self.expect(i, ("Tensor",), f"{what} argument {k}")
        payload = delegate_payload(self.program, self.segments, delegate, self.named)
        if delegate.id == "EthosUBackend":
            self.ethosu(what, payload, call.args, call.delegate_index, layout)
        if delegate.id == "VgfBackend":
            self.vgf(what, payload, call.delegate_index, layout)
        tosa = payload if delegate.id == "TOSABackend" else self.tosa.get(tosa_key(payload))
        if tosa is not None:
            summary = check_tosa(tosa, f"of {self.where}, {what}", self.limits.max_memory - layout.memory)
            self.tosa_io(what, summary, call.args)
            layout.delegate_tosa[call.delegate_index] = (tosa, summary)
        return set(call.args)

    def ethosu(self, what: str, payload: bytes, args: list[int], index: int, layout: MethodLayout) -> None:
        """Check the payload, its I/O table against the call, and its command stream; note whether the delegate
        runs on the simulator (the engine's choice), whose memory must fit the limit."""
        try:
            p = parse_payload(payload)
        except TosakitError as exc:
            raise self.fail(f"{what}: {exc.message}", exc.hint) from None
        if len(p.inputs) + len(p.outputs) != len(args):
            raise self.fail(f"{what}: the payload has {len(p.inputs)} inputs and {len(p.outputs)} outputs, the call "
                            f"passes {len(args)} tensors")
        for k, (t, i) in enumerate(zip(p.inputs + p.outputs, args)):
            need, have = math.prod(t.shape) * t.elem_size, tensor_nbytes(self.values[i].val)
            if need != have:
                raise self.fail(f"{what}: tensor {k} of the payload is {need} bytes, value {i} holds {have}")
        try:
            require_simulated(decode(p.cmd_data))
        except NotSimulatedError as exc:  # well-formed, not simulated (an Ethos-U85 feature not run yet)
            if self.engine == "npu":
                raise self.fail(f"{what}: {exc.message}",
                                "run the delegate's TOSA instead: --engine tosa (compiled with --debug-info)") from None
            return
        except TosakitError as exc:
            raise self.fail(f"{what}: {exc.message}", exc.hint) from None
        if self.engine == "tosa":
            return
        need = memory_needed(p)
        if layout.memory + need > self.limits.max_memory:
            raise self.fail(f"{what}: simulating it needs {need} bytes (scratch {p.scratch_size}, weights "
                            f"{len(p.weight_data)}, fast scratch {FAST_SCRATCH_BYTES}, each byte with its written "
                            f"flag), more than the {self.limits.max_memory - layout.memory} bytes the "
                            f"{self.limits.max_memory}-byte memory limit leaves", RAISE_MEMORY_HINT)
        layout.delegate_npu[index] = p

    def vgf(self, what: str, payload: bytes, index: int, layout: MethodLayout) -> None:
        """Check the VGF container; note whether the delegate runs on the VGF engine (the engine's choice: by
        default when this machine has the stack)."""
        container = parse_vgf(payload, f"{self.where}, {what}")
        if self.engine == "vgf":
            vgf_stack.find_stack()  # the engine asked for: its missing parts are the error
        if self.engine == "vgf" or (self.engine is None and not vgf_stack.missing()):
            layout.delegate_vgf[index] = container

    def tosa_io(self, what: str, summary: TosaSummary, args: list[int]) -> None:
        ios = summary.inputs + summary.outputs
        if len(ios) != len(args):
            raise self.fail(f"{what}: its TOSA takes {len(summary.inputs)} inputs and gives {len(summary.outputs)} "
                            f"outputs, the call passes {len(args)} tensors")
        for k, (io, i) in enumerate(zip(ios, args)):
            t = self.values[i].val
            order = list(t.dim_order) or list(range(len(t.sizes)))
            stored = tuple(t.sizes[d] for d in order)
            same_shape = stored == io.shape if k < len(summary.inputs) else math.prod(stored) == math.prod(io.shape)
            if TOSA_IO_TYPES.get(io.dtype) != t.scalar_type or not same_shape:
                raise self.fail(f"{what}: TOSA tensor {io.name!r} is {io.dtype}{list(io.shape)}, value {i} is "
                                f"{t.scalar_type.name}{list(stored)}")


def delegate_payload(program: S.Program, segments: list[bytes], delegate: S.BackendDelegate,
                     named: dict[str, NamedBlob] | None = None) -> bytes:
    """A delegate's processed bytes (indices already checked by the reader), an Ethos-U payload's external blocks
    fetched from ``named`` (the data map: a .ptd's entries, then the program's named data)."""
    ref = delegate.processed
    blob = program.backend_delegate_data[ref.index].data if ref.location == S.DataLocation.INLINE else \
        segments[ref.index]
    if delegate.id == "EthosUBackend" and named:
        blob = inline_external(blob, lambda key: named[key].data if key in named else None)
    return blob


def data_map(program: S.Program, segments: list[bytes], data: dict[str, NamedBlob] | None) -> dict[str, NamedBlob]:
    """What a program's delegates and external constants may read by key: ``data`` (a .ptd's entries) first, then
    the program's own named data, as ExecuTorch merges them."""
    named = {nd.key: NamedBlob(segments[nd.segment_index]) for nd in program.named_data or []}
    return {**named, **(data or {})}


def check_engine(engine: str | None) -> None:
    """Refuse an engine name other than "npu", "tosa" or None (the default)."""
    if engine is not None and engine not in ENGINES:
        raise TosakitError(f"unknown engine {engine!r}", did_you_mean(str(engine), ENGINES))


def validate(program: S.Program, segments: list[bytes], tosa: dict[str, bytes], limits: Limits,
             name: str, engine: str | None = None, named: dict[str, NamedBlob] | None = None
             ) -> dict[str, MethodLayout]:
    """Check every method of a read program, with its data map ``named`` (``data_map``); what each needs to run
    (with Ethos-U delegates on ``engine``, see ENGINES), or a TosakitError naming the fault."""
    named = named if named is not None else data_map(program, segments, None)
    return {plan.name: _Method(plan, program, segments, tosa, limits, name, engine, named).check()
            for plan in program.execution_plan}
