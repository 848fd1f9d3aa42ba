"""The host runtime: execute a .pte (ours or ExecuTorch's) with PyTorch's kernels and the TOSA
reference model, honouring its memory plan."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import TosakitError, first_line
from ..program import tosa_key
from ..program.pte import deserialize_pte
from ..program.schema import (
    DataLocation,
    DelegateCall,
    ExecutionPlan,
    FreeCall,
    JumpFalseCall,
    KernelCall,
    MoveCall,
    Null,
    Program,
    torch_dtype_of,
)
from ..program import schema as S
from .reference import run_stored

# Kernels torch has no ".out" overload for: the functional op runs and its result is copied to ``out``.
FUNCTIONAL_OUT = {
    "quantized_decomposed::quantize_per_tensor.out": "quantize_per_tensor",
    "quantized_decomposed::dequantize_per_tensor.out": "dequantize_per_tensor",
    "quantized_decomposed::quantize_per_channel.out": "quantize_per_channel",
    "quantized_decomposed::dequantize_per_channel.out": "dequantize_per_channel",
}
# ExecuTorch's dim-order copies: with contiguous tensors they are dtype-converting copies.
COPIES = {"dim_order_ops::_to_dim_order_copy.out", "dim_order_ops::_clone_dim_order.out"}


@dataclass(frozen=True)
class TensorSpec:
    """What the program expects of an input (or produces as an output)."""

    dtype: torch.dtype
    shape: tuple[int, ...]

    def __str__(self) -> str:
        return f"{str(self.dtype).replace('torch.', '')}[{', '.join(map(str, self.shape))}]"


def _base_type(arg) -> str:
    t = str(arg.real_type)
    while t.startswith("Optional["):
        t = t[len("Optional["):-1]
    return t


class Kernel:
    """One operator of the program, called with its KernelCall's values (schema args, then outputs)."""

    def __init__(self, name: str, overload: str):
        from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401  (registers ops)

        self.key = f"{name}.{overload}"
        self.copy_only = self.key in COPIES
        self.functional = self.key in FUNCTIONAL_OUT
        namespace, _, op = name.partition("::")
        try:
            packet = getattr(torch.ops.quantized_decomposed, FUNCTIONAL_OUT[self.key]) if self.functional else (
                getattr(getattr(torch.ops, namespace), op))
            self.op = packet.default if self.functional else getattr(packet, overload or "default")
        except (AttributeError, RuntimeError):
            if not self.copy_only:
                raise TosakitError(f"the program calls kernel {self.key}, which the host runtime does not have",
                                   "run this program on a device, or report the operator to tosakit") from None
            self.op = None

    def __call__(self, args: list) -> None:
        out = args[-1]
        if self.copy_only:
            out.copy_(args[0].to(out.dtype))
            return
        positional, keywords = [], {}
        for a, value in zip(self.op._schema.arguments, args):
            if _base_type(a) == "ScalarType" and isinstance(value, int):
                value = torch_dtype_of(value)
            if a.kwarg_only:
                keywords[a.name] = value
            else:
                positional.append(value)
        if self.functional:
            out.copy_(self.op(*positional, **keywords))
        else:
            self.op(*positional, **keywords)


class LoadedProgram:
    """A .pte ready to run: ``run([tensors]) -> [tensors]``."""

    def __init__(self, data: bytes, name: str = "<bytes>", tosa: dict[str, bytes] | None = None):
        self.name = name
        try:
            self.program, self.segments = deserialize_pte(data)
        except TosakitError as exc:
            raise TosakitError(f"{name}: {exc.message}", exc.hint) from None
        self._tosa = dict(tosa or {})
        for nd in self.program.named_data or []:
            self._tosa.setdefault(nd.key, self.segments[nd.segment_index])

    # -------------------------------------------------------------- description

    @property
    def method_names(self) -> list[str]:
        return [p.name for p in self.program.execution_plan]

    def plan(self, method: str = "forward") -> ExecutionPlan:
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
    def _spec(t) -> TensorSpec:
        return TensorSpec(torch_dtype_of(t.scalar_type), tuple(t.sizes))

    # -------------------------------------------------------------- execution

    def run(self, inputs, method: str = "forward") -> list[torch.Tensor]:
        """Execute ``method`` on ``inputs`` (torch tensors or numpy arrays); returns new tensors."""
        return _Execution(self, self.plan(method)).run(list(inputs))

    def delegate_tosa(self, delegate) -> bytes:
        """The TOSA a delegate runs from: its payload (TOSABackend) or the TOSA carried beside it."""
        data = self.delegate_payload(delegate)
        if delegate.id == "TOSABackend":
            return data
        key = tosa_key(data)
        if key not in self._tosa:
            raise TosakitError(
                f"{self.name}: delegate {delegate.id} has no TOSA graph inside the program, so it cannot run "
                f"on the host",
                "recompile with `tosakit compile ... --debug-info` (Python: compile_spec.with_debug_info())")
        return self._tosa[key]

    def delegate_payload(self, delegate) -> bytes:
        ref = delegate.processed
        if ref.location == DataLocation.INLINE:
            return self.program.backend_delegate_data[ref.index].data
        return self.segments[ref.index]


class _Execution:
    """The values and memory of one run."""

    def __init__(self, loaded: LoadedProgram, plan: ExecutionPlan):
        self.loaded, self.plan = loaded, plan
        program: Program = loaded.program
        self.arenas = [None] + [torch.zeros(max(int(n), 1), dtype=torch.uint8) for n in plan.non_const_buffer_sizes[1:]]
        constant = program.constant_segment
        self.const_data = loaded.segments[constant.segment_index] if constant and loaded.segments else b""
        self.const_offsets = constant.offsets if constant else [0]
        self.values: list = [None] * len(plan.values)
        for i, ev in enumerate(plan.values):
            self.values[i] = self._materialize(i, ev.val)
        self.kernels: list[Kernel | None] = [None] * len(plan.operators)

    def _tensor(self, i: int, t) -> torch.Tensor:
        order = list(t.dim_order) or list(range(len(t.sizes)))
        if sorted(order) != list(range(len(t.sizes))):
            raise TosakitError(f"value {i} has dim order {order}, not a permutation of its {len(t.sizes)} dims",
                               "the .pte is corrupt: re-export it")
        stored = self._stored_tensor(i, t, tuple(t.sizes[d] for d in order))
        return stored.permute(tuple(np.argsort(order).tolist()))  # the torch-layout view of the stored bytes

    def _stored_tensor(self, i: int, t, shape: tuple[int, ...]) -> torch.Tensor:
        """The tensor's bytes (constant, planned or fresh) as a contiguous tensor of its stored ``shape``."""
        dtype = torch_dtype_of(t.scalar_type)
        nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
        if t.data_buffer_idx > 0:
            if t.data_buffer_idx >= len(self.const_offsets):
                raise TosakitError(f"value {i} reads constant {t.data_buffer_idx}, but the program has "
                                   f"{len(self.const_offsets) - 1}", "the .pte is corrupt: re-export it")
            start = self.const_offsets[t.data_buffer_idx]
            raw = self.const_data[start:start + nbytes]
            if len(raw) != nbytes:
                raise TosakitError(f"constant {t.data_buffer_idx} is truncated ({len(raw)} of {nbytes} bytes)",
                                   "the .pte is corrupt: re-export it")
            return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape) if nbytes else torch.empty(shape, dtype=dtype)
        if t.allocation_info is not None:
            a = t.allocation_info
            offset = a.memory_offset_low | (a.memory_offset_high << 32)
            if not 0 < a.memory_id < len(self.arenas) or offset + nbytes > self.arenas[a.memory_id].numel():
                raise TosakitError(f"value {i} lies outside memory arena {a.memory_id}",
                                   "the .pte's memory plan is corrupt: re-export it")
            if nbytes == 0:
                return torch.empty(shape, dtype=dtype)
            return self.arenas[a.memory_id][offset:offset + nbytes].view(dtype).reshape(shape)
        return torch.empty(shape, dtype=dtype)

    def _materialize(self, i: int, val):
        if isinstance(val, S.Tensor):
            return self._tensor(i, val)
        if isinstance(val, Null):
            return None
        if isinstance(val, (S.Int, S.Bool, S.Double, S.String)):
            return next(iter(vars(val).values()))
        if isinstance(val, S.IntList):
            return _Deferred(lambda values, items=list(val.items): [values[j] for j in items])
        if isinstance(val, (S.DoubleList, S.BoolList)):
            return list(val.items)
        if isinstance(val, (S.TensorList, S.OptionalTensorList)):
            return _Deferred(lambda values, items=list(val.items): [values[j] for j in items])
        raise TosakitError(f"value {i} has an unsupported kind {type(val).__name__}", "re-export the model")

    def _arg(self, index: int):
        v = self.values[index]
        return v.resolve(self.values) if isinstance(v, _Deferred) else v

    def _bind_inputs(self, inputs: list) -> None:
        specs = [LoadedProgram._spec(self.plan.values[i].val) for i in self.plan.inputs]
        if len(inputs) != len(specs):
            raise TosakitError(f"{self.loaded.name} takes {len(specs)} input(s) "
                               f"({', '.join(map(str, specs))}), got {len(inputs)}",
                               "pass one tensor per input, in order")
        for k, (x, spec, vi) in enumerate(zip(inputs, specs, self.plan.inputs)):
            t = torch.as_tensor(np.asarray(x)) if not isinstance(x, torch.Tensor) else x
            if t.dtype != spec.dtype or tuple(t.shape) != spec.shape:
                got = TensorSpec(t.dtype, tuple(t.shape))
                raise TosakitError(f"input {k} of {self.loaded.name}: expected {spec}, got {got}",
                                   "pass tensors of the exported shape and dtype")
            self.values[vi].copy_(t)

    def run(self, inputs: list) -> list[torch.Tensor]:
        self._bind_inputs(inputs)
        instructions = self.plan.chains[0].instructions if self.plan.chains else []
        pc = 0
        with torch.no_grad():
            while pc < len(instructions):
                pc = self._step(instructions[pc].instr_args, pc)
        return [self.values[i].clone() if isinstance(self.values[i], torch.Tensor) else self.values[i]
                for i in self.plan.outputs]

    def _step(self, instr, pc: int) -> int:
        if isinstance(instr, KernelCall):
            kernel = self.kernels[instr.op_index]
            if kernel is None:
                op = self.plan.operators[instr.op_index]
                kernel = self.kernels[instr.op_index] = Kernel(op.name, op.overload)
            args = [self._arg(i) for i in instr.args]
            try:
                kernel(args)
            except TosakitError:
                raise
            except Exception as exc:  # torch's message can hold whole tensors: name the call instead
                raise TosakitError(f"{self.loaded.name}: instruction {pc}, kernel {kernel.key}, failed on "
                                   f"({', '.join(_kind(a) for a in args)}): {first_line(exc)}",
                                   "the program does not fit this kernel's schema; re-export it, or report it "
                                   "to tosakit if tosakit wrote it") from None
        elif isinstance(instr, DelegateCall):
            self._delegate(instr)
        elif isinstance(instr, MoveCall):
            self.values[instr.move_to] = self.values[instr.move_from]
        elif isinstance(instr, JumpFalseCall):
            if not bool(self._arg(instr.cond_value_index)):
                return instr.destination_instruction
        elif not isinstance(instr, FreeCall):
            raise TosakitError(f"unknown instruction {type(instr).__name__}", "re-export the model")
        return pc + 1

    def _delegate(self, call: DelegateCall) -> None:
        delegate = self.plan.delegates[call.delegate_index]
        tosa = self.loaded.delegate_tosa(delegate)
        args = [self._arg(i) for i in call.args]
        n_out = len(args) - _tosa_input_count(tosa)
        ins, outs = args[:len(args) - n_out], args[len(args) - n_out:]
        orders = [list(self.plan.values[i].val.dim_order) or list(range(t.dim())) for i, t in zip(call.args, args)]
        results = run_stored(tosa, ins, orders[:len(ins)], orders[len(ins):])
        for out, res in zip(outs, results):
            out.copy_(res.reshape(out.shape))


def _kind(value) -> str:
    """A value as an error message shows it: dtype and shape for tensors, never their contents."""
    if isinstance(value, torch.Tensor):
        return str(TensorSpec(value.dtype, tuple(value.shape)))
    if isinstance(value, (list, tuple)):
        return f"[{', '.join(_kind(v) for v in value[:8])}{', ...' if len(value) > 8 else ''}]"
    return repr(value) if isinstance(value, (int, float, bool, type(None))) else type(value).__name__


class _Deferred:
    """A list value whose members are other values (resolved when used)."""

    def __init__(self, fn: Callable):
        self.fn = fn

    def resolve(self, values):
        return self.fn(values)


def _tosa_input_count(tosa: bytes) -> int:
    from tosa.TosaGraph import TosaGraph

    graph = TosaGraph.GetRootAs(tosa, 0)
    block = graph.Regions(0).Blocks(0)
    return block.InputsLength()


def load(path: str | Path, tosa: dict[str, bytes] | None = None) -> LoadedProgram:
    """Read a .pte for running on the host."""
    path = Path(path)
    if not path.is_file():
        raise TosakitError(f"{path} not found", "give the path of a .pte file")
    return LoadedProgram(path.read_bytes(), str(path), tosa)
