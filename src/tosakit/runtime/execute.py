"""Running a validated method: its arenas (exactly the bytes its tensors use, never resizable), its values,
ExecuTorch CPU kernels as PyTorch implements them, Ethos-U delegates on the command-stream simulator or the TOSA
reference model (the engine validation chose), other delegates on the TOSA reference model, within the run's
step and time limits."""

from __future__ import annotations

import sys
import time
from typing import Callable

import numpy as np
import torch

from ..errors import TosakitError, first_line
from ..native import captured_output
from ..program import schema as S
from ..program.kernels import KernelSchema, kernel_key, kernel_schemas
from .ethosu.profile import NpuProfile
from .ethosu.simulate import simulate
from .ethosu.system import compile_flags
from .stored import run_stored
from .records import EngineComparison, NpuCall, Step, TensorSpec
from .tosa_sandbox import IsolatedReferenceModel
from .trace import EventTracer, kernel_event_name, now
from .validate import MethodLayout, tensor_nbytes

# Kernels torch has no ".out" overload for: the functional op runs and its result is copied to ``out``.
FUNCTIONAL_OUT = {
    "quantized_decomposed::quantize_per_tensor.out": "quantize_per_tensor",
    "quantized_decomposed::dequantize_per_tensor.out": "dequantize_per_tensor",
    "quantized_decomposed::quantize_per_channel.out": "quantize_per_channel",
    "quantized_decomposed::dequantize_per_channel.out": "dequantize_per_channel",
}
SHARED_ARENA = 2  # ExecuTorch's memory id of the mutable buffers a program's methods share
# ExecuTorch's dim-order copies: with contiguous tensors they are dtype-converting copies.
COPIES = {"dim_order_ops::_to_dim_order_copy.out", "dim_order_ops::_clone_dim_order.out"}


class Kernel:
    """One ExecuTorch kernel, called with its KernelCall's values (schema arguments, then the return slot)."""

    def __init__(self, schema: KernelSchema):
        from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401  (registers ops)

        self.schema, self.key = schema, schema.key
        self.copy_only, self.functional = self.key in COPIES, self.key in FUNCTIONAL_OUT
        self.op = None
        if self.copy_only:
            return
        name, _, overload = self.key.partition(".")
        namespace, _, op = name.partition("::")
        if namespace == "cortex_m":
            from ..backends.cortex_m import ops  # noqa: F401  (registers the operators with torch)
        try:
            if self.functional:
                self.op = getattr(torch.ops.quantized_decomposed, FUNCTIONAL_OUT[self.key]).default
            else:
                self.op = getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")
        except (AttributeError, RuntimeError):
            raise TosakitError(f"the program calls ExecuTorch kernel {self.key}, which the host runtime (PyTorch) "
                               f"does not implement", "run this program on a device, or report the operator to "
                               "tosakit") from None

    def __call__(self, args: list):
        """Run; the value for the return slot (the out tensor(s) are written in place)."""
        out = args[-1]
        if self.copy_only:
            out.copy_(args[0].to(out.dtype))
            return out
        positional, keywords = [], {}
        for a, value in zip(self.schema.args, args):
            if a.base == "ScalarType" and isinstance(value, int):
                value = S.torch_dtype_of(value)
            elif a.base == "MemoryFormat":
                value = None  # planned tensors are contiguous in their dim order
            if a.is_out and self.functional:
                continue
            if a.kwarg_only:
                keywords[a.name] = value
            else:
                positional.append(value)
        outs = [(a.name, t, t.shape) for a, v in zip(self.schema.args, args) if a.is_out
                for t in (v if isinstance(v, list) else [v])]
        result = self.op(*positional, **keywords)
        if self.functional:
            out.copy_(result)
        for name, t, shape in outs:  # an out= kernel resizes a mismatched out (torch only warns): refuse it
            if t.shape != shape:
                raise ValueError(f"it resized out {name!r} from {list(shape)} to {list(t.shape)}: the program's "
                                 f"tensor shapes do not fit this call")
        return result if not self.schema.outs else out


class Execution:
    """The values and memory of one run of a ``program.LoadedProgram`` (which imports this module, so it is not
    named here); with ``compare``, each simulated Ethos-U delegate that carries its TOSA runs it too, and
    ``comparisons`` holds how their outputs compare; with ``per_operation``, each such delegate call is also
    handed to it (``NpuCall``), what it finds into ``findings``."""

    def __init__(self, loaded, plan: S.ExecutionPlan, layout: MethodLayout, compare: bool = False,
                 per_operation: Callable[[NpuCall], list] | None = None, tracer: EventTracer | None = None,
                 profile: bool = False):
        self.loaded, self.plan, self.layout, self.limits = loaded, plan, layout, loaded.limits
        self.tracer = tracer
        self.steps: list[Step] | None = [] if profile else None  # with ``profile``: each instruction's time
        self._npu_profile: NpuProfile | None = None  # the last simulated delegate call's, when profiling
        self.compare, self.comparisons = compare, []
        self.per_operation, self.findings = per_operation, []
        self.arenas = loaded.arenas(plan.name)
        constant = loaded.program.constant_segment
        self.const_data = loaded.segments[constant.segment_index] if constant else b""
        self.const_offsets = constant.offsets if constant else [0]
        self.values: list = [self._materialize(ev.val) for ev in plan.values]
        schemas = kernel_schemas()
        self.kernels = [Kernel(schemas[kernel_key(op.name, op.overload)]) for op in plan.operators]
        self.event_names = [kernel_event_name(op.name, op.overload) for op in plan.operators]
        self.engines: dict[int, str] = {}  # delegate index -> the engine that ran it

    def _tensor(self, t: S.Tensor) -> torch.Tensor:
        order = list(t.dim_order) or list(range(len(t.sizes)))
        stored = self._stored_tensor(t, tuple(t.sizes[d] for d in order))
        return stored.permute(tuple(np.argsort(order).tolist()))  # the torch-layout view of the stored bytes

    def _stored_tensor(self, t: S.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """The tensor's bytes (constant, planned or fresh; bounds checked by validation) in its stored ``shape``."""
        dtype, nbytes = S.torch_dtype_of(t.scalar_type), tensor_nbytes(t)
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        if t.extra_tensor_info is not None and t.extra_tensor_info.location == S.TensorDataLocation.EXTERNAL:
            raw = bytearray(self.loaded.named[t.extra_tensor_info.fully_qualified_name].data)  # checked: its layout
            return torch.frombuffer(raw, dtype=dtype).reshape(shape)
        if t.data_buffer_idx > 0 and t.allocation_info is None:
            start = self.const_offsets[t.data_buffer_idx]
            raw = bytearray(self.const_data[start:start + nbytes])
            return torch.frombuffer(raw, dtype=dtype).reshape(shape)
        if t.allocation_info is None:
            return _zeros(nbytes).view(dtype).reshape(shape)
        a = t.allocation_info
        offset = a.memory_offset_low | (a.memory_offset_high << 32)
        return self.arenas[a.memory_id][offset:offset + nbytes].view(dtype).reshape(shape)

    def _materialize(self, val):
        if isinstance(val, S.Tensor):
            return self._tensor(val)
        if isinstance(val, S.Null):
            return None
        if isinstance(val, (S.Int, S.Bool, S.Double, S.String)):
            return next(iter(vars(val).values()))
        if isinstance(val, (S.DoubleList, S.BoolList)):
            return list(val.items)
        return _Deferred(list(val.items))  # IntList, TensorList, OptionalTensorList: members are other values

    def _arg(self, index: int):
        v = self.values[index]
        return [None if j == -1 else self.values[j] for j in v.items] if isinstance(v, _Deferred) else v

    def _bind_inputs(self, inputs: list) -> None:
        specs = self.loaded.input_specs(self.plan.name)
        if len(inputs) != len(specs):
            raise TosakitError(f"{self.loaded.name} takes {len(specs)} input(s) "
                               f"({', '.join(map(str, specs))}), got {len(inputs)}",
                               "pass one tensor per input, in order")
        for k, (x, spec, vi) in enumerate(zip(inputs, specs, self.plan.inputs)):
            t = torch.as_tensor(np.asarray(x)) if not isinstance(x, torch.Tensor) else x
            if t.dtype != spec.dtype or tuple(t.shape) != spec.shape:
                raise TosakitError(f"input {k} of {self.loaded.name}: expected {spec}, got {_kind(t)}",
                                   "pass tensors of the exported shape and dtype")
            self.values[vi].copy_(t)

    def run(self, inputs: list) -> list[torch.Tensor]:
        self._bind_inputs(inputs)
        instructions = self.plan.chains[0].instructions if self.plan.chains else []
        deadline = time.monotonic() + self.limits.timeout
        pc, steps, started = 0, 0, now()
        if self.tracer is not None:
            self.tracer.begin_execute()
        # torch's C++ warnings (e.g. an out resized) stay off the terminal unless the run succeeds
        with torch.no_grad(), captured_output((2,)) as printed:
            while pc < len(instructions):
                steps += 1
                if steps > self.limits.max_steps or time.monotonic() > deadline:
                    raise TosakitError(f"{self.loaded.name}: stopped at instruction {pc} after {steps - 1} steps "
                                       f"and {self.limits.timeout - (deadline - time.monotonic()):.1f} s, "
                                       f"past the run's limit", "raise --timeout if you trust the file")
                pc = self._step(instructions[pc].instr_args, pc, deadline)
        sys.stderr.write(printed[0])
        outputs = [self.values[i].clone() for i in self.plan.outputs]
        if self.tracer is not None:
            self.tracer.end_execute(started, outputs)
        return outputs

    def _step(self, instr, pc: int, deadline: float) -> int:
        if self.steps is None:
            return self._run_step(instr, pc, deadline)
        start = now()
        after = self._run_step(instr, pc, deadline)
        if isinstance(instr, S.KernelCall):
            self.steps.append(Step(pc, self.event_names[instr.op_index], now() - start))
        elif isinstance(instr, S.DelegateCall):
            delegate = self.plan.delegates[instr.delegate_index]
            self.steps.append(Step(pc, delegate.id, now() - start, instr.delegate_index,
                                   self.engines.get(instr.delegate_index), self._npu_profile))
        return after

    def _run_step(self, instr, pc: int, deadline: float) -> int:
        tracer = self.tracer
        start = now() if tracer is not None else 0
        if isinstance(instr, S.KernelCall):
            kernel = self.kernels[instr.op_index]
            args = [self._arg(i) for i in instr.args]
            try:
                call = now() if tracer is not None else 0
                result = kernel(args)
            except TosakitError:
                raise
            except Exception as exc:  # torch's message can hold whole tensors: name the call instead
                raise TosakitError(f"{self.loaded.name}: instruction {pc}, kernel {kernel.key}, failed on "
                                   f"({', '.join(_kind(a) for a in args)}): {first_line(exc)}",
                                   "the program does not fit this kernel's schema; re-export it, or report it "
                                   "to tosakit if tosakit wrote it") from None
            if tracer is not None:
                call = (call, now())
            if not kernel.schema.outs:
                self.values[instr.args[-1]] = result.item() if isinstance(result, torch.Tensor) else result
            if tracer is not None:
                tracer.kernel(pc, self.event_names[instr.op_index], start, call, self._arg(instr.args[-1]))
        elif isinstance(instr, S.DelegateCall):
            self._npu_profile = None
            self._delegate(instr, pc, deadline)
            if tracer is not None:
                tracer.delegate(pc, self.plan.delegates[instr.delegate_index].id, start, (start, now()),
                                [self._arg(i) for i in instr.args], self._npu_profile)
        elif isinstance(instr, S.MoveCall):
            self.values[instr.move_to] = self.values[instr.move_from]
        elif isinstance(instr, S.JumpFalseCall):
            cond = self._arg(instr.cond_value_index)
            if not bool(cond.all() if isinstance(cond, torch.Tensor) else cond):
                return instr.destination_instruction
        return pc + 1

    def _delegate(self, call: S.DelegateCall, pc: int, deadline: float) -> None:
        index = call.delegate_index
        delegate = self.plan.delegates[index]
        npu, tosa = self.layout.delegate_npu.get(index), self.layout.delegate_tosa.get(index)
        vgf = index in self.layout.delegate_vgf
        if npu is None and tosa is None and not vgf:  # validation found no way to run it
            raise self.loaded.no_tosa(delegate, index)
        args = [self._arg(i) for i in call.args]
        orders = [list(self.plan.values[i].val.dim_order) or list(range(t.dim())) for i, t in zip(call.args, args)]
        what = f"{self.loaded.name}: instruction {pc} (delegate {index}, {delegate.id})"
        if vgf:
            results, outs = self._vgf(delegate, args, orders, deadline, what)
            self.engines[index] = "vgf"
        elif npu is None:
            ins, outs = args[:len(tosa[1].inputs)], args[len(tosa[1].inputs):]
            results = self._tosa(tosa[0], ins, orders, deadline, what)
            self.engines[index] = "tosa"
        else:
            ins, outs = args[:len(npu.inputs)], args[len(npu.inputs):]
            results = self._npu(index, ins, outs, orders, deadline, what)
            self.engines[index] = "npu"
            if self.per_operation is not None and tosa is not None:
                self.findings += self.per_operation(self._npu_call(index, tosa[0], ins, orders, deadline))
        if self.compare and tosa is not None and self.engines[index] != "tosa":
            reference = self._tosa(tosa[0], args[:len(tosa[1].inputs)], orders, deadline, what)
            self.comparisons += [_compared(index, delegate.id, k, got, want.reshape(got.shape))
                                 for k, (got, want) in enumerate(zip(results, reference))]
        try:
            for out, res in zip(outs, results, strict=True):
                out.copy_(res.reshape(out.shape))
        except (RuntimeError, ValueError) as exc:
            raise TosakitError(f"{what}: its results do not fit the program's output tensors: {first_line(exc)}",
                               "the delegate's TOSA and the program disagree: re-export it") from None

    def _sandbox(self, deadline: float) -> IsolatedReferenceModel:
        """The child process that runs the delegates of a file from anywhere (the program's, kept across runs)."""
        return self.loaded.sandbox(self.limits.max_memory - self.layout.memory, deadline)

    def _tosa(self, tosa: bytes, ins: list, orders: list, deadline: float, what: str) -> list[torch.Tensor]:
        """The delegate's TOSA on the reference model (in the child process for files from anywhere)."""
        in_orders, out_orders = orders[:len(ins)], orders[len(ins):]
        if not self.loaded.isolate:
            return run_stored(tosa, ins, in_orders, out_orders)
        child = self._sandbox(deadline)
        return run_stored(tosa, ins, in_orders, out_orders, lambda g, arrays: child.run(g, arrays, what))

    def _npu_call(self, index: int, tosa: bytes, ins: list, orders: list, deadline: float) -> NpuCall:
        """Delegate ``index``'s call as a per-operation check gets it (in the child process for files from
        anywhere)."""
        delegate = self.plan.delegates[index]
        sandbox = self._sandbox(deadline) if self.loaded.isolate else None
        return NpuCall(f"delegate {index}", self.loaded.delegate_payload(delegate), tosa, delegate.compile_specs,
                       self._stored_inputs(index, ins, orders), sandbox)

    def _stored_inputs(self, index: int, ins: list, orders: list) -> list[np.ndarray]:
        """Delegate ``index``'s inputs as the I/O table stores them: the call's tensors' bytes in their stored
        order (NHWC for channels-last ones), as the device's driver copies them."""
        payload = self.layout.delegate_npu[index]
        return [_stored(x, order).reshape(-1).view(torch.uint8).numpy().view(f"<i{t.elem_size}")
                for x, order, t in zip(ins, orders, payload.inputs)]

    def _npu(self, index: int, ins: list, outs: list, orders: list, deadline: float,
             what: str) -> list[torch.Tensor]:
        """Delegate ``index``'s command stream on the simulator (in the child process for files from anywhere),
        on its stored inputs; the results come back in torch layout."""
        payload = self.layout.delegate_npu[index]
        arrays = self._stored_inputs(index, ins, orders)
        timed = self.steps is not None or self.tracer is not None
        flags = compile_flags(self.plan.delegates[index].compile_specs) if timed else None
        if self.loaded.isolate:
            blob = self.loaded.delegate_payload(self.plan.delegates[index])
            results, message = self._sandbox(deadline).simulate(blob, arrays, what, flags)
            if message:
                self._npu_profile = NpuProfile.from_message(message, flags)
        else:
            try:
                run = simulate(payload, arrays, deadline=deadline, profile=flags)
            except TosakitError as exc:  # name the program and the call, keep the kind (NpuAccessError, ...)
                raise exc.prefixed(what) from None
            results, self._npu_profile = run.outputs, run.profile
        return _unstored(results, outs, orders[len(ins):])

    def _vgf(self, delegate: S.BackendDelegate, args: list, orders: list, deadline: float,
             what: str) -> tuple[list[torch.Tensor], list]:
        """A VGF delegate's payload on Arm's ML SDK stack (a child process kept for the program's runs), on its
        inputs as stored; its results in torch layout, and the call's output tensors."""
        engine = self.loaded.vgf_engine(deadline)
        blob = self.loaded.delegate_payload(delegate)
        n_in, _ = engine.io_counts(blob, what)
        ins, outs = args[:n_in], args[n_in:]
        arrays = [_stored(x, order).numpy() for x, order in zip(ins, orders)]
        expected = [(np.dtype(str(o.dtype).removeprefix("torch.")), tuple(o.permute(order).shape))
                    for o, order in zip(outs, orders[n_in:])]
        results = engine.run(blob, arrays, expected, what)
        return _unstored(results, outs, orders[n_in:]), outs


def _unstored(results: list[np.ndarray], outs: list[torch.Tensor], orders: list) -> list[torch.Tensor]:
    """A delegate's results, stored in its output tensors' dim orders, as torch-layout tensors."""
    tensors = []
    for res, out, order in zip(results, outs, orders):
        shape, raw = tuple(out.permute(order).shape), bytearray(np.ascontiguousarray(res).tobytes())
        stored = (torch.frombuffer(raw, dtype=out.dtype).reshape(shape) if raw
                  else torch.empty(shape, dtype=out.dtype))  # frombuffer refuses 0 bytes
        tensors.append(stored.permute(tuple(np.argsort(order).tolist())))
    return tensors


def _stored(t: torch.Tensor, order: list[int]) -> torch.Tensor:
    """``t`` (torch layout) as its bytes are stored: permuted to its dim order, contiguous."""
    return t.detach().permute(tuple(order)).contiguous()


def _compared(index: int, backend: str, output: int, got: torch.Tensor, want: torch.Tensor) -> EngineComparison:
    equal = int((got == want).sum())
    diff = float((got.double() - want.double()).abs().max()) if got.numel() else 0.0
    return EngineComparison(index, backend, output, got.numel(), equal, diff)


def new_arenas(loaded, layout: MethodLayout, shared: dict[int, torch.Tensor]) -> list[torch.Tensor]:
    """A method's arenas as loading it makes them: zeroed, with its state's initial bytes written in. Arena 2 holds
    the state the program's methods share (ExecuTorch's ``share_mutable_buffers``, which its runner's
    ``share_memory_arenas`` serves): made once, by the first method loaded, at the largest size any method plans,
    and kept in ``shared``."""
    arenas, fresh = [], set()
    for k, n in enumerate(layout.arena_bytes):
        if k == SHARED_ARENA and k in shared:
            arenas.append(shared[k])
            continue
        if k == SHARED_ARENA:
            n = max(other.arena_bytes[k] for other in loaded.layouts.values() if len(other.arena_bytes) > k)
        arenas.append(_zeros(n))
        fresh.add(k)
        if k == SHARED_ARENA:
            shared[k] = arenas[k]
    for arena, offset, segment, at, nbytes in layout.initial:
        if arena in fresh and nbytes:  # a state tensor with a zero-size dimension has no bytes to start from
            data = loaded.segments[segment][at:at + nbytes]
            arenas[arena][offset:offset + nbytes] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return arenas


def _zeros(nbytes: int) -> torch.Tensor:
    """Zeroed bytes whose storage kernels cannot grow (an ``out=`` resize past them fails, never allocates)."""
    return torch.from_numpy(np.zeros(max(nbytes, 1), dtype=np.uint8))


def _kind(value) -> str:
    """A value as an error message shows it: dtype and shape for tensors, never their contents."""
    if isinstance(value, torch.Tensor):
        return str(TensorSpec(S.scalar_type_of(value.dtype), tuple(value.shape)))
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_kind(v) for v in value[:8])}{', ...' if len(value) > 8 else ''}]"
    return repr(value) if isinstance(value, (int, float, bool, type(None))) else type(value).__name__


class _Deferred:
    """A list value whose members are other values (resolved when used)."""

    def __init__(self, items: list[int]):
        self.items = items
