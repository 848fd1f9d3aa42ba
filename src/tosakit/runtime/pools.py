"""The memory a device runner must provide for a program: its planned arenas, each delegate's scratch, the
constant data, and the method and temp allocator pools ExecuTorch 1.5.1's runtime draws from when it loads and
runs a method — so a pool too small is found on the host, not on the board.

The pool figures replay, allocation by allocation, what ``Program::load_method`` / ``Method::init`` and
``Method::execute`` ask of their ``MemoryAllocator`` (a bump allocator: no per-allocation overhead, each
allocation aligned up from the previous end), for a 64-bit runtime whose pools start 16-byte aligned (as
arm_executor_runner declares them). A backend's own allocations in its init are its own (EthosUBackend puts
its handle on the heap) and not counted. A 32-bit Cortex-M runtime's pointers and sizes are half as wide and no more
aligned, so it needs at most these figures."""

from __future__ import annotations

from dataclasses import dataclass

from ..backends.ethosu.payload import parse_payload
from ..errors import TosakitError
from ..program import schema as S
from .ethosu.system import compile_flags
from .validate import data_map, delegate_payload

# sizeof / alignof of the runtime's types on a 64-bit host (ExecuTorch 1.5.1; tests/oracle/memory_runner.cpp
# prints the public ones). BackendDelegate (a FreeableBuffer and two pointers) and Chain (a pointer, a Span and a
# pointer) are private to method.cpp: their sizes follow from those.
POINTER = 8
EVALUE = 16
TENSOR = 8  # executorch::aten::Tensor: a TensorImpl pointer
TENSOR_IMPL = 64
TENSOR_META = 24  # ScalarType + Span<DimOrderType>
COMPILE_SPEC = 24  # key pointer + SizedBuffer
FREEABLE_BUFFER = 40
BOXED_LIST = 24  # BoxedEvalueList<T>: ArrayRef<EValue*> + T*
ARRAY_REF = 16
SPAN = 16  # InstructionArgs = Span<EValue*>
OPTIONAL_TENSOR = 16
BACKEND_DELEGATE = FREEABLE_BUFFER + 2 * POINTER
CHAIN = POINTER + SPAN + POINTER
INT32 = 4  # SizesType, StridesType
DIM_ORDER = 1  # DimOrderType (uint8)
DIM_LIMIT = 16  # kTensorDimensionLimit
POOL_ALIGNMENT = 16  # the pools' base alignment the figures assume (and the Ethos-U scratch's alignment)

# resolve_operator puts an operator's TensorMeta list on the temp allocator when the pool is at least this big
# per kernel argument, else on the method allocator
META_BOUND_PER_ARG = TENSOR_META + DIM_ORDER * DIM_LIMIT


class _Pool:
    """A bump allocator from a 16-byte aligned base, like ExecuTorch's MemoryAllocator: only the end moves."""

    def __init__(self) -> None:
        self.used = 0

    def allocate(self, size: int, alignment: int) -> None:
        self.used = -(-self.used // alignment) * alignment + size


@dataclass(frozen=True)
class DelegateMemory:
    """What one delegate call needs besides the pools' bookkeeping. ``scratch``: bytes EthosUBackend takes from
    the temp allocator per call (the payload's scratch_size, inputs and outputs inside it; None for another
    backend); ``fast_scratch``: the separate fast-scratch region a Dedicated_Sram stream addresses, described in
    words (the payload does not state its size)."""

    index: int
    backend: str
    scratch: int | None
    fast_scratch: str


@dataclass(frozen=True)
class RunnerMemory:
    """The memory one method needs on a device running ExecuTorch 1.5.1's runtime, in bytes."""

    method: str
    arenas: tuple[int, ...]  # each planned arena (memory id 1, 2, ...)
    constants: int  # constant segment and named data, read from the program file
    delegates: tuple[DelegateMemory, ...]
    load_temp: int  # a temp pool this big holds every operator's kernel metadata at load_method
    execute_temp: int  # the most one instruction takes from the temp pool at execute
    method_pool: int  # load_method's use of the method pool, the temp pool being ``temp_pool``
    method_pool_without_temp: int  # load_method's use of the method pool with an empty temp pool
    runner_method_pool: int  # arm_executor_runner's method pool: arenas (16-aligned), load_method, inputs' EValues
    kernel_temp_unknown: tuple[str, ...]  # operators and delegates whose temp requests are not computed here

    @property
    def temp_pool(self) -> int:
        """The temp pool to give: kernel metadata at load, and every instruction's requests at execute."""
        return max(self.load_temp, self.execute_temp)

    def lines(self) -> list[str]:
        """The figures, one per line, for ``tosakit inspect``."""
        arenas = ", ".join(f"{n} B" for n in self.arenas) or "none"
        lines = [f"planned arena(s): {arenas}",
                 f"constant data: {self.constants} B (in the program file)",
                 f"method allocator pool: {self.method_pool} B for load_method with the temp pool below "
                 f"({self.method_pool_without_temp} B with an empty temp pool); arm_executor_runner, which also "
                 f"places the arenas and the inputs' EValues there: {self.runner_method_pool} B",
                 f"temp allocator pool: {self.temp_pool} B (kernel metadata at load {self.load_temp} B, "
                 f"largest instruction at execute {self.execute_temp} B)"]
        if self.kernel_temp_unknown:
            lines.append("  not counted: the temp memory of " + ", ".join(self.kernel_temp_unknown))
        for d in self.delegates:
            scratch = "unknown (not an Ethos-U payload)" if d.scratch is None else f"{d.scratch} B"
            lines.append(f"delegate {d.index} ({d.backend}): scratch {scratch} from the temp pool per call; "
                         f"fast scratch {d.fast_scratch}")
        lines.append("(64-bit runtime, pools 16-byte aligned; a 32-bit Cortex-M runtime needs at most these)")
        return lines

    def summary(self) -> str:
        """One line for the compile summary."""
        return (f"runner memory ({self.method}): method pool {self.runner_method_pool} B (arenas "
                f"{sum(self.arenas)} B + load_method {self.method_pool} B + inputs), temp pool {self.temp_pool} B, "
                f"constants {self.constants} B; `tosakit inspect` details it")

    def as_dict(self) -> dict:
        """The figures for report.json."""
        return {"method": self.method, "arenas": list(self.arenas), "constants": self.constants,
                "method_pool": self.method_pool, "method_pool_without_temp": self.method_pool_without_temp,
                "runner_method_pool": self.runner_method_pool, "temp_pool": self.temp_pool,
                "load_temp": self.load_temp, "execute_temp": self.execute_temp,
                "kernel_temp_unknown": list(self.kernel_temp_unknown),
                "delegates": [vars(d) for d in self.delegates]}


# Portable kernels that ask the temp allocator for memory at execute (ExecuTorch 1.5.1's kernels/portable:
# only topk does, a (value, index) pair of 16 bytes per element along the reduced dimension)
_TOPK = "aten::topk.values"


def runner_memory(program: S.Program, segments: list[bytes], plan: S.ExecutionPlan,
                  named: dict | None = None) -> RunnerMemory:
    """The figures for method ``plan`` of ``program`` (its segments' bytes ``segments``, its data map ``named``),
    with a temp pool of ``load_temp`` or more."""
    load_temp = max((META_BOUND_PER_ARG * len(i.instr_args.args) for i in _instructions(plan)
                     if isinstance(i.instr_args, S.KernelCall)), default=0)
    named = named if named is not None else data_map(program, segments, None)
    delegates = tuple(_delegate(program, segments, k, d, named) for k, d in enumerate(plan.delegates))
    execute_temp, unknown = _execute_temp(plan, delegates)
    return RunnerMemory(plan.name, tuple(plan.non_const_buffer_sizes[1:]), _constant_bytes(program, segments), delegates,
                        load_temp, execute_temp, method_pool_used(plan, load_temp), method_pool_used(plan, 0),
                        runner_method_pool(plan, load_temp), unknown)


def runner_method_pool(plan: S.ExecutionPlan, temp_pool: int) -> int:
    """The method pool arm_executor_runner needs for ``plan`` beside a temp pool of ``temp_pool`` bytes: each
    planned arena (16-byte aligned), then load_method, then the inputs' EValue list."""
    pool = _Pool()
    for size in plan.non_const_buffer_sizes[1:]:
        if size:
            pool.allocate(size, POOL_ALIGNMENT)
    _load_method(pool, plan, temp_pool)
    pool.allocate(EVALUE * len(plan.inputs), POINTER)
    return pool.used


def check_pools(plan: S.ExecutionPlan, memory: RunnerMemory, method_pool: int | None, temp_pool: int | None) -> None:
    """Refuse a method or temp pool too small for ``plan``, naming the pool and the size it needs (the method
    pool as arm_executor_runner fills it; without ``temp_pool``, beside the temp pool ``memory`` states)."""
    temp = memory.temp_pool if temp_pool is None else temp_pool
    if temp < memory.execute_temp:
        raise TosakitError(f"temp allocator pool of {temp} bytes is too small for method {plan.name!r}: an "
                           f"instruction takes {memory.execute_temp} bytes from it at execute",
                           f"give the runner a temp pool of at least {memory.execute_temp} bytes, "
                           f"{memory.temp_pool} to hold the kernel metadata at load too "
                           "(ET_ARM_BAREMETAL_SCRATCH_TEMP_ALLOCATOR_POOL_SIZE)")
    needed = runner_method_pool(plan, temp)
    if method_pool is not None and method_pool < needed:
        raise TosakitError(f"method allocator pool of {method_pool} bytes is too small for method {plan.name!r}: "
                           f"arm_executor_runner needs {needed} bytes beside a {temp}-byte temp pool (planned "
                           f"arenas {sum(memory.arenas)} B, load_method {method_pool_used(plan, temp)} B, the "
                           "inputs' EValues)",
                           f"give the runner a method pool of at least {needed} bytes "
                           "(ET_ARM_BAREMETAL_METHOD_ALLOCATOR_POOL_SIZE)")


def method_pool_used(plan: S.ExecutionPlan, temp_pool: int) -> int:
    """Bytes ``Program::load_method`` takes from a method pool (16-byte aligned base) given a temp pool of
    ``temp_pool`` bytes, allocation by allocation as ExecuTorch 1.5.1's Method::init makes them."""
    pool = _Pool()
    _load_method(pool, plan, temp_pool)
    return pool.used


def _load_method(pool: _Pool, plan: S.ExecutionPlan, temp_pool: int) -> None:
    pool.allocate(EVALUE * len(plan.values), POINTER)
    if plan.inputs:
        pool.allocate(len(plan.inputs), 1)  # input_set_: a bool per input
    for value in plan.values:
        _value(pool, value.val)
    pool.allocate(BACKEND_DELEGATE * len(plan.delegates), POINTER)
    for d in plan.delegates:  # the compile specs; backend init's own allocations are the backend's
        pool.allocate(COMPILE_SPEC * len(d.compile_specs), POINTER)
    pool.allocate(CHAIN * len(plan.chains), POINTER)
    for chain in plan.chains:
        pool.allocate(POINTER * len(chain.instructions), POINTER)  # OpFunction per instruction
        pool.allocate(SPAN * len(chain.instructions), POINTER)  # InstructionArgs per instruction
        for instruction in chain.instructions:
            call = instruction.instr_args
            if isinstance(call, (S.KernelCall, S.DelegateCall)):
                pool.allocate(POINTER * len(call.args), POINTER)
            if isinstance(call, S.KernelCall) and temp_pool < META_BOUND_PER_ARG * len(call.args):
                pool.allocate(TENSOR_META * len(call.args), POINTER)
                for arg in call.args:
                    val = plan.values[arg].val
                    if isinstance(val, S.Tensor):
                        pool.allocate(DIM_ORDER * len(val.sizes), 1)


def _value(pool: _Pool, val) -> None:
    """parse_values' allocations for one value."""
    if isinstance(val, S.Tensor):
        rank = len(val.sizes)
        if val.shape_dynamism != S.TensorShapeDynamism.STATIC:  # resizable: sizes and dim order copied out
            pool.allocate(INT32 * rank, INT32)
            pool.allocate(DIM_ORDER * rank, 1)
        pool.allocate(INT32 * rank, INT32)  # strides
        pool.allocate(TENSOR_IMPL, POINTER)
    elif isinstance(val, S.IntList):
        pool.allocate(POINTER * len(val.items), POINTER)
        pool.allocate(8 * len(val.items), 8)
        pool.allocate(BOXED_LIST, POINTER)
    elif isinstance(val, (S.BoolList, S.DoubleList, S.String)):
        pool.allocate(ARRAY_REF, POINTER)
    elif isinstance(val, S.TensorList):
        pool.allocate(TENSOR * len(val.items), POINTER)
        pool.allocate(POINTER * len(val.items), POINTER)
        pool.allocate(BOXED_LIST, POINTER)
    elif isinstance(val, S.OptionalTensorList):
        pool.allocate(POINTER * len(val.items), POINTER)
        pool.allocate(OPTIONAL_TENSOR * len(val.items), POINTER)
        pool.allocate(BOXED_LIST, POINTER)


def _instructions(plan: S.ExecutionPlan):
    return [i for chain in plan.chains for i in chain.instructions]


def _execute_temp(plan: S.ExecutionPlan, delegates: tuple[DelegateMemory, ...]) -> tuple[int, tuple[str, ...]]:
    """The most one instruction takes from the temp pool (it is reset after each), and the delegates and
    operators whose requests are unknown."""
    most, unknown = 0, []
    for instruction in _instructions(plan):
        call = instruction.instr_args
        if isinstance(call, S.DelegateCall):
            d = delegates[call.delegate_index]
            if d.scratch is None:
                unknown.append(f"delegate {d.index} ({d.backend})")
            else:
                most = max(most, d.scratch)
        elif isinstance(call, S.KernelCall):
            op = plan.operators[call.op_index]
            if f"{op.name}.{op.overload}" == _TOPK:
                temp = _topk_temp(plan, call)
                if temp is None:
                    unknown.append(_TOPK)
                else:
                    most = max(most, temp)
    return most, tuple(dict.fromkeys(unknown))


def _topk_temp(plan: S.ExecutionPlan, call: S.KernelCall) -> int | None:
    """topk.values(self, k, dim, ...): a 16-byte (value, index) pair per element along ``dim`` (None for
    arguments that are not a tensor and an int dimension within its rank)."""
    if len(call.args) < 3:
        return None
    tensor, dim = plan.values[call.args[0]].val, plan.values[call.args[2]].val
    if not isinstance(tensor, S.Tensor) or not isinstance(dim, S.Int):
        return None
    if not tensor.sizes:
        return 16
    rank = len(tensor.sizes)
    return 16 * tensor.sizes[dim.int_val] if -rank <= dim.int_val < rank else None


def _delegate(program: S.Program, segments: list[bytes], index: int, d: S.BackendDelegate,
              named: dict | None) -> DelegateMemory:
    if d.id != "EthosUBackend":
        return DelegateMemory(index, d.id, None, "unknown (not an Ethos-U payload)")
    mode = next((f.split("=", 1)[1] for f in compile_flags(d.compile_specs) if f.startswith("--memory-mode=")), None)
    if mode is not None and mode.startswith("Dedicated_Sram"):
        fast = (f"a separate SRAM region (memory mode {mode}): the span the command stream addresses, which the "
                "payload does not state; it is Vela's SRAM figure, which `tosakit compile` prints as the fast scratch")
    else:
        fast = f"none (memory mode {mode or 'unstated'}: no separate fast-scratch region)"
    return DelegateMemory(index, d.id, parse_payload(delegate_payload(program, segments, d, named)).scratch_size, fast)


def _constant_bytes(program: S.Program, segments: list[bytes]) -> int:
    constants = program.constant_segment
    segment = len(segments[constants.segment_index]) if constants and segments else 0
    return segment + sum(len(segments[nd.segment_index]) for nd in program.named_data or [])
