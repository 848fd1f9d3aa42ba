"""Emit a lowered graph as an ExecuTorch program: values, memory plan, kernel and delegate calls."""

from __future__ import annotations

import hashlib
import operator
from dataclasses import dataclass, field

import torch
import torch.utils._pytree as pytree
from torch.fx import GraphModule, Node

from ..backends.cortex_m.scratch import scratch_buffer
from ..backends.ethosu.payload import inline_external
from ..capture import FQN, STATE, graph_attr, state_writes
from ..errors import REPORT_GRAPH_HINT, TosakitError, UnsupportedOpError
from ..lower.tosa_graph import NHWC, identity, storage_order
from .kernels import runtime_kernels
from .ptd import NamedBlob, TensorLayout
from .pte import constant_segment_bytes
from .schema import (
    AllocationDetails,
    BackendDelegate,
    BackendDelegateDataReference,
    BackendDelegateInlineData,
    Bool,
    BoolList,
    Chain,
    ContainerMetadata,
    DataLocation,
    DelegateCall,
    Double,
    DoubleList,
    EValue,
    ExecutionPlan,
    ExtraTensorInfo,
    Instruction,
    Int,
    IntList,
    KernelCall,
    NamedData,
    Null,
    Operator,
    OptionalTensorList,
    Program,
    String,
    SubsegmentOffsets,
    Tensor,
    TensorDataLocation,
    TensorList,
    scalar_type_of,
)

ALIGNMENT = 16
DEFAULT_CONSTANTS_TAG = "_default_external_constant"  # ExecuTorch's tag for constants moved to a .ptd

# The .out kernels ExecuTorch registers for the quantize/dequantize ops (torch has no .out for them).
QD_OUT_SCHEMAS = {
    "quantized_decomposed.quantize_per_tensor.default":
        "quantized_decomposed::quantize_per_tensor.out(Tensor input, float scale, int zero_point, int quant_min, "
        "int quant_max, ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)",
    "quantized_decomposed.dequantize_per_tensor.default":
        "quantized_decomposed::dequantize_per_tensor.out(Tensor input, float scale, int zero_point, int quant_min, "
        "int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None, Tensor(a!) out) -> Tensor(a!)",
    "quantized_decomposed.quantize_per_channel.default":
        "quantized_decomposed::quantize_per_channel.out(Tensor input, Tensor scales, Tensor zero_points, int axis, "
        "int quant_min, int quant_max, ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)",
    "quantized_decomposed.dequantize_per_channel.default":
        "quantized_decomposed::dequantize_per_channel.out(Tensor input, Tensor scales, Tensor? zero_points, "
        "int axis, int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None, "
        "Tensor(a!) out) -> Tensor(a!)",
}


def executorch_call_delegate(lowered_module, *args):
    """Graph marker for a delegate call; running it runs the delegate's reference graph."""
    return lowered_module(*args)


# Arguments an .out kernel drops because the ``out`` tensor already says them (e.g. _to_copy, full).
IMPLIED_BY_OUT = {"dtype", "layout", "device", "pin_memory"}


def _copy_variant(target):
    """Views run as copies on the CPU runtime: aten.view.default -> aten.view_copy.default."""
    packet = getattr(torch.ops.aten, target.overloadpacket.__name__ + "_copy", None)
    return getattr(packet, target._overloadname, None) if packet is not None else None


def out_schema(target) -> torch._C.FunctionSchema:
    """The ``.out`` schema of the runtime kernel that runs ``target`` on the CPU."""
    key = str(target)
    if key in QD_OUT_SCHEMAS:
        return torch._C.parse_schema(QD_OUT_SCHEMAS[key])
    if not isinstance(target, torch._ops.OpOverload):
        raise TosakitError(f"{target} is not an ATen operator the CPU runtime can run",
                           "keep the model to torch operators (no Python functions in forward)")
    kernels = runtime_kernels()
    for fn in (target, _copy_variant(target)):
        if fn is None:
            continue
        names = [(a.name, str(a.type)) for a in fn._schema.arguments]  # types tell le.Tensor from le.Scalar
        implied = [n for n in names if n[0] not in IMPLIED_BY_OUT]
        packet = fn.overloadpacket
        for overload in packet.overloads():
            cand = getattr(packet, overload)._schema
            args = [(a.name, str(a.type)) for a in cand.arguments if not a.is_out]
            if (any(a.is_out for a in cand.arguments) and args in (names, implied)
                    and f"{cand.name}.{cand.overload_name}" in kernels):
                return cand
    raise UnsupportedOpError(f"{target} has no kernel in the ExecuTorch CPU runtime",
                             "delegate it: pick a target that lowers it (see the report), or quantize with "
                             "--quantize so the NPU can take it")


def _is_view(target) -> bool:
    """A view op, or the ``_copy`` kernel a view op runs as."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    name = target.overloadpacket.__name__
    base = getattr(torch.ops.aten, name[:-len("_copy")], None) if name.endswith("_copy") else None
    return target.is_view or (base is not None and any(getattr(base, o).is_view for o in base.overloads()))


def dim_order(node: Node, orders: dict[Node, tuple[int, ...]]) -> tuple[int, ...] | None:
    """The dim order ExecuTorch's kernel writes ``node``'s output in, from its inputs' (``orders``): a view runs as a
    ``_copy`` kernel writing its input's order (an order of another rank: contiguous); any other op is
    channels-last only when an input is (the strides export recorded can be a view's: a permute of a contiguous
    NCHW map looks channels-last). None when the output's own strides say it."""
    inputs = [orders[a] for a in node.all_input_nodes if a in orders]
    val = node.meta.get("val")
    rank = val.dim() if isinstance(val, torch.Tensor) else None
    if _is_view(node.target) and isinstance(node.args[0], Node) and node.args[0] in orders:
        src = orders[node.args[0]]
        return src if len(src) == rank else identity(rank)
    if rank is not None and storage_order(val) == NHWC and NHWC not in inputs:
        return identity(rank)
    return None


@dataclass
class PlannedTensor:
    value: int
    nbytes: int
    first: int
    last: int
    offset: int = 0


@dataclass
class EmittedProgram:
    """The program table, its segment bytes, and the memory plan summary."""

    program: Program
    segments: list[bytes]
    arena_bytes: int
    constant_bytes: int
    kernel_ops: list[str] = field(default_factory=list)
    external: dict[str, dict[str, NamedBlob]] = field(default_factory=dict)  # .ptd tag -> key -> blob


def encode_treespec(spec) -> str | None:
    """The pytree spec as ExecuTorch stores it (torch's JSON treespec dump)."""
    return None if spec is None else pytree.treespec_dumps(spec)


@dataclass
class Pools:
    """What the methods of one program share: constant tensors, state's initial bytes (the mutable data segment),
    delegate payloads, named data; and, for several methods, where each state buffer lives in the arena they share
    (arena 2, ExecuTorch's shared mutable buffers: every method reads and writes the same bytes)."""

    constants: list[bytes] = field(default_factory=list)
    initial: list[bytes] = field(default_factory=list)
    delegate_data: list[BackendDelegateInlineData] = field(default_factory=list)
    named: dict[str, bytes] = field(default_factory=dict)
    shared_state: dict[str, int] | None = None  # buffer name -> offset in arena 2
    shared_bytes: int = 0
    constants_tag: str | None = None  # constant tensors go to this .ptd, by name (None: the constant segment)
    external: dict[str, dict[str, NamedBlob]] = field(default_factory=dict)  # .ptd tag -> key -> blob


class Emitter:
    """Walks the final graph once, building the ``ExecutionPlan``."""

    def __init__(self, gm: GraphModule, pools: Pools | None = None):
        self.gm = gm
        self.pools = pools or Pools()
        self.values: list[EValue] = []
        self.node_value: dict[Node, int] = {}
        self.instructions: list[Instruction] = []
        self.operators: list[Operator] = []
        self.delegates: list[BackendDelegate] = []
        self.planned: dict[int, PlannedTensor] = {}
        self.orders: dict[Node, tuple[int, ...]] = {}  # each tensor node's dim order (see ``dim_order``)

    # ------------------------------------------------------------ values

    def _add(self, val) -> int:
        self.values.append(EValue(val))
        return len(self.values) - 1

    def _tensor_value(self, t: torch.Tensor, planned: bool, order: tuple[int, ...] | None = None) -> int:
        idx = self._add(Tensor(scalar_type=scalar_type_of(t.dtype), sizes=list(t.shape),
                               dim_order=list(order if order is not None else storage_order(t))))
        if planned:
            nbytes = max(t.numel() * t.element_size(), 1)
            self.planned[idx] = PlannedTensor(idx, nbytes, len(self.instructions), len(self.instructions))
        return idx

    def _constant(self, t: torch.Tensor, name: str | None = None) -> int:
        """A constant tensor: in the constant segment, or, ``named`` and placed outside (``constants_tag``), in a
        .ptd under its name (methods sharing a name share the bytes)."""
        kind, order = scalar_type_of(t.dtype), list(range(t.dim()))
        tag = self.pools.constants_tag
        if name is None or tag is None:
            self.pools.constants.append(_bytes(t))
            return self._add(Tensor(scalar_type=kind, sizes=list(t.shape), dim_order=order,
                                    data_buffer_idx=len(self.pools.constants)))
        entries = self.pools.external.setdefault(tag, {})
        blob = NamedBlob(_bytes(t), TensorLayout(kind, list(t.shape), order))
        key = name if entries.setdefault(name, blob) == blob else f"{name}.{hashlib.sha256(blob.data).hexdigest()[:8]}"
        entries[key] = blob
        return self._add(Tensor(scalar_type=kind, sizes=list(t.shape), dim_order=order,
                                extra_tensor_info=ExtraTensorInfo(0, key, TensorDataLocation.EXTERNAL)))

    def _use(self, idx: int) -> int:
        if idx in self.planned:
            self.planned[idx].last = max(self.planned[idx].last, len(self.instructions))
        return idx

    def _arg(self, value, type_name: str, like: torch.Tensor | None) -> int:
        """The EValue index for one kernel argument of schema type ``type_name``."""
        base = type_name
        while base.startswith("Optional["):
            base = base[len("Optional["):-1]
        if value is None:
            return self._add(Null())
        if base == "Tensor":
            if isinstance(value, Node):
                return self._use(self.node_value[value])
            return self._constant(torch.tensor(value, dtype=like.dtype if like is not None else torch.float32))
        if base == "List[Tensor]":
            return self._add(TensorList([self._arg(v, "Tensor", like) for v in value]))
        if base == "List[Optional[Tensor]]":  # indexing's ``x[:, :, pos]``: -1 for each None, as ExecuTorch emits
            return self._add(OptionalTensorList([-1 if v is None else self._arg(v, "Tensor", like) for v in value]))
        if base == "ScalarType" or isinstance(value, torch.dtype):
            return self._add(Int(int(scalar_type_of(value))))
        if base == "bool" or isinstance(value, bool):
            return self._add(Bool(bool(value)))
        if base in ("int", "SymInt") or (base == "number" and isinstance(value, int)):
            return self._add(Int(int(value)))
        if base in ("float", "number"):
            return self._add(Double(float(value)))
        if base in ("List[int]", "List[SymInt]"):
            return self._add(IntList([self._add(Int(int(v))) for v in value]))
        if base == "List[float]":
            return self._add(DoubleList([float(v) for v in value]))
        if base == "List[bool]":
            return self._add(BoolList([bool(v) for v in value]))
        if base == "str":
            return self._add(String(str(value)))
        if base in ("MemoryFormat", "Layout", "Device"):
            return self._add(Null())
        raise TosakitError(f"cannot emit a CPU kernel argument of type {type_name} ({value!r})",
                           "this operator's CPU kernel call is not supported; please report it")

    def _state(self, node: Node) -> int:
        """A buffer the program updates: planned memory that lives as long as the method, its initial value in
        the mutable data segment (loaded when the method is), never an input."""
        val, initial = node.meta["val"], node.meta[STATE].initial
        if initial.dtype != val.dtype or tuple(initial.shape) != tuple(val.shape):
            raise TosakitError(f"state {node.meta[STATE].name!r} starts as {initial.dtype} {list(initial.shape)} but "
                               f"the graph reads {val.dtype} {list(val.shape)}", REPORT_GRAPH_HINT)
        shared = self.pools.shared_state
        idx = self._tensor_value(val, planned=shared is None, order=tuple(range(val.dim())))
        tensor = self.values[idx].val
        if shared is not None:
            offset = shared[node.meta[STATE].name]
            tensor.allocation_info = AllocationDetails(2, offset & 0xFFFFFFFF, offset >> 32)
        self.pools.initial.append(_bytes(initial))
        tensor.data_buffer_idx = len(self.pools.initial)
        return idx

    def _write_state(self, state: int, value: int) -> None:
        """``aten::copy_(state, value)``: the update written back at the end of the call, as ExecuTorch does."""
        op = self._operator(torch.ops.aten.copy_.default._schema)
        self.instructions.append(Instruction(KernelCall(op, [state, self._use(value), self._add(Bool(False)), state])))

    # ------------------------------------------------------------ instructions

    def _operator(self, schema: torch._C.FunctionSchema) -> int:
        op = Operator(schema.name, schema.overload_name)
        if op not in self.operators:
            self.operators.append(op)
        return self.operators.index(op)

    def _kernel_call(self, node: Node) -> None:
        schema = out_schema(node.target)
        fn_args = node.target._schema.arguments if isinstance(node.target, torch._ops.OpOverload) else None
        bound = dict(node.kwargs)
        names = [a.name for a in fn_args] if fn_args is not None else [a.name for a in schema.arguments if not a.is_out]
        bound.update(zip(names, node.args))
        val = node.meta["val"]
        outs = list(val) if isinstance(val, (tuple, list)) else [val]
        like = outs[0] if isinstance(outs[0], torch.Tensor) else None
        args = []
        for a in schema.arguments:
            if a.is_out:
                continue
            default = a.default_value if a.has_default_value() else None
            args.append((a, bound.get(a.name, default)))
        arg_values = [self._arg(v, str(a.real_type), like) for a, v in args]
        order = dim_order(node, self.orders) if len(outs) == 1 else None
        out_idx = [self._tensor_value(t, planned=True, order=order) for t in outs]
        if isinstance(outs[0], torch.Tensor) and len(outs) == 1:
            self.orders[node] = order or storage_order(outs[0])
        single = len(out_idx) == 1 and not isinstance(val, (tuple, list))
        self.node_value[node] = out_idx[0] if single else tuple(out_idx)
        out_args, ret = self._out_args(node, schema, out_idx)
        arg_iter, full = iter(arg_values), []
        for a in schema.arguments:
            full.append(out_args.pop(0) if a.is_out else next(arg_iter))
        self.instructions.append(Instruction(KernelCall(self._operator(schema), [*full, ret])))

    def _out_args(self, node: Node, schema, out_idx: list[int]) -> tuple[list[int], int]:
        """The values of the schema's out arguments (a tensor each, or one TensorList for ``Tensor(a!)[]``)
        and of the return slot after them: the one out tensor, else a TensorList of every output."""
        outs = [a for a in schema.arguments if a.is_out]
        if len(outs) == 1 and isinstance(outs[0].type, torch.ListType):
            return [self._add(TensorList(list(out_idx)))], self._add(TensorList(list(out_idx)))
        if len(outs) != len(out_idx):
            raise TosakitError(f"node {node.name} ({node.target}) gives {len(out_idx)} outputs, but its CPU kernel "
                               f"{schema.name}.{schema.overload_name} writes {len(outs)}",
                               REPORT_GRAPH_HINT)
        return list(out_idx), out_idx[0] if len(out_idx) == 1 else self._add(TensorList(list(out_idx)))

    def _delegate_call(self, node: Node) -> None:
        lowered = self.gm.get_submodule(node.args[0].target)
        inputs = [self._use(self.node_value[a]) for a in node.args[1:]]
        outs = [self._tensor_value(t, planned=True) for t in node.meta["val"]]
        self.node_value[node] = tuple(outs)
        self.pools.delegate_data.append(BackendDelegateInlineData(lowered.stored_bytes))
        self.delegates.append(BackendDelegate(lowered.backend_id,
                                              BackendDelegateDataReference(DataLocation.INLINE,
                                                                           len(self.pools.delegate_data) - 1),
                                              list(lowered.compile_specs)))
        self.pools.named.update(lowered.named_data)
        for tag, entries in lowered.external_data.items():
            self.pools.external.setdefault(tag, {}).update(entries)
        self.instructions.append(Instruction(DelegateCall(len(self.delegates) - 1, [*inputs, *outs])))

    # ------------------------------------------------------------ whole program

    def emit(self, in_spec=None, out_spec=None, name: str = "forward") -> ExecutionPlan:
        inputs, outputs, state = [], [], []
        writes = state_writes(self.gm.graph)
        for node in self.gm.graph.nodes:
            if node.op == "placeholder" and STATE in node.meta:
                self.orders[node] = storage_order(node.meta["val"])
                self.node_value[node] = self._state(node)
                state.append(self.node_value[node])
            elif node.op == "placeholder":
                self.orders[node] = storage_order(node.meta["val"])
                idx = self._tensor_value(node.meta["val"], planned=True)
                self.node_value[node] = idx
                inputs.append(idx)
            elif node.op == "get_attr":
                value = graph_attr(self.gm, node)
                if isinstance(value, torch.Tensor):
                    self.node_value[node] = self._constant(value, node.meta.get(FQN, str(node.target)))
            elif node.op == "call_function" and node.target is executorch_call_delegate:
                self._delegate_call(node)
            elif node.op == "call_function" and node.target is scratch_buffer:  # planned; no instruction writes it
                self.node_value[node] = self._tensor_value(node.meta["val"], planned=True)
            elif node.op == "call_function" and node.target is operator.getitem:
                self.node_value[node] = self.node_value[node.args[0]][node.args[1]]
                if isinstance(node.meta.get("val"), torch.Tensor):  # a delegate's output, as it declares it
                    self.orders[node] = storage_order(node.meta["val"])
            elif node.op == "call_function":
                self._kernel_call(node)
            elif node.op == "output":
                for buffer, value in writes:
                    if value is not buffer:
                        self._write_state(self.node_value[buffer], self.node_value[value])
                for a in node.args[0][:len(node.args[0]) - len(writes)]:
                    if not isinstance(a, Node) or a.op in ("placeholder", "get_attr"):
                        raise TosakitError(f"model output {a} is an input or a constant, which a .pte cannot return",
                                           "return computed tensors only (e.g. x.clone() for a passthrough)")
                    outputs.append(self.node_value[a])
            else:
                raise TosakitError(f"unexpected graph node {node.format_node()}",
                                   "export with torch.export.export so the graph holds only ATen ops")
        for idx in inputs:  # inputs are written before the first instruction, outputs read after the last
            self.planned[idx].first = 0
        for idx in outputs:
            self.planned[idx].last = len(self.instructions)
        for idx in state:  # kept from call to call: no other tensor may share its bytes
            if idx in self.planned:
                self.planned[idx].first, self.planned[idx].last = 0, len(self.instructions)
        arena = plan_memory(list(self.planned.values()))
        for p in self.planned.values():
            self.values[p.value].val.allocation_info = AllocationDetails(1, p.offset & 0xFFFFFFFF, p.offset >> 32)
        return ExecutionPlan(
            name=name,
            container_meta_type=ContainerMetadata(encode_treespec(in_spec), encode_treespec(out_spec)),
            values=self.values,
            inputs=inputs,
            outputs=outputs,
            chains=[Chain(inputs=inputs, outputs=outputs, instructions=self.instructions)],
            operators=self.operators,
            delegates=self.delegates,
            non_const_buffer_sizes=[0, arena] + ([self.pools.shared_bytes] if self.pools.shared_state else []),
        )


def build_program(plans: list[ExecutionPlan], pools: Pools, blocks_in_program: bool = False) -> EmittedProgram:
    """The program of ``plans`` (its methods) and the segments of what they share: constants (segment 0, maybe
    empty), state's initial bytes, named data (with ``blocks_in_program``, the delegates' placed blocks too, instead
    of in .ptd files: ExecuTorch's delegates read them from either)."""
    if blocks_in_program:
        _blocks_into_program(plans, pools)
    data, const_offsets = constant_segment_bytes(pools.constants)
    segments = [data] if pools.constants or pools.named or pools.initial else []
    mutable = None
    if pools.initial:
        initial, initial_offsets = constant_segment_bytes(pools.initial)
        segments.append(initial)
        mutable = [SubsegmentOffsets(len(segments) - 1, initial_offsets)]
    named_data = []
    for key, blob in pools.named.items():
        segments.append(blob)
        named_data.append(NamedData(key, len(segments) - 1))
    program = Program(
        version=0,
        execution_plan=plans,
        backend_delegate_data=pools.delegate_data,
        constant_segment=SubsegmentOffsets(0, const_offsets),
        mutable_data_segments=mutable,
        named_data=named_data,
    )
    ops = list(dict.fromkeys(f"{o.name}.{o.overload}" for p in plans for o in p.operators))
    arena = max(sum(p.non_const_buffer_sizes) for p in plans)
    return EmittedProgram(program, segments, arena, sum(len(c) for c in pools.constants), ops, pools.external)


def _blocks_into_program(plans: list[ExecutionPlan], pools: Pools) -> None:
    """Each Ethos-U block placed outside its payload: into the program's named data when several payloads name it
    (stored once), else back inline, the payload as any ExecuTorch runtime reads it."""
    payloads = [pools.delegate_data[d.processed.index] for p in plans for d in p.delegates
                if d.id == "EthosUBackend" and d.processed.location == DataLocation.INLINE]
    inline: dict[str, bytes] = {}
    for tag, entries in list(pools.external.items()):
        for key, blob in list(entries.items()):
            if blob.layout is None:
                named = sum(key.encode("ascii") in p.data for p in payloads)
                (pools.named if named > 1 else inline)[key] = blob.data
                del entries[key]
        if not entries:
            del pools.external[tag]
    for p in payloads:
        p.data = inline_external(p.data, inline.get)


def _bytes(t: torch.Tensor) -> bytes:
    t = t.detach().contiguous()
    return (t if t.dtype != torch.bfloat16 else t.view(torch.int16)).numpy().tobytes()


def plan_memory(tensors: list[PlannedTensor]) -> int:
    """Greedy by size: each tensor takes the lowest 16-aligned offset free over its lifetime."""
    placed: list[PlannedTensor] = []
    arena = 0
    for t in sorted(tensors, key=lambda t: (-t.nbytes, t.first)):
        size = -(-t.nbytes // ALIGNMENT) * ALIGNMENT
        busy = sorted((p.offset, p.offset + -(-p.nbytes // ALIGNMENT) * ALIGNMENT) for p in placed
                      if p.first <= t.last and t.first <= p.last)
        offset = 0
        for start, stop in busy:
            if offset + size <= start:
                break
            offset = max(offset, stop)
        t.offset = offset
        placed.append(t)
        arena = max(arena, offset + size)
    return arena


def program_from_graph(gm: GraphModule, in_spec=None, out_spec=None, constants_tag: str | None = None
                       ) -> EmittedProgram:
    """Emit ``gm`` (user inputs as placeholders, delegates as executorch_call_delegate) as method 'forward', its
    constant tensors in ``<constants_tag>.ptd`` when given."""
    pools = Pools(constants_tag=constants_tag)
    return build_program([Emitter(gm, pools).emit(in_spec, out_spec)], pools)


def program_from_methods(methods: dict[str, tuple[GraphModule, object, object]], blocks_in_program: bool = False
                         ) -> EmittedProgram:
    """One program of several methods (name -> graph, in_spec, out_spec), e.g. an LLM's prefill and decode. State
    that the graphs read by the same buffer name is one tensor: every method reads and writes the same bytes.
    Delegate blocks placed outside their payloads (equal ones stored once) go into the program's named data with
    ``blocks_in_program``, else into .ptd files."""
    pools, shapes = Pools(shared_state={}), {}
    for name, (gm, _, _) in methods.items():
        for node in gm.graph.nodes:
            if node.op == "placeholder" and STATE in node.meta:
                val, buffer = node.meta["val"], node.meta[STATE].name
                kind = (val.dtype, tuple(val.shape))
                if shapes.setdefault(buffer, kind) != kind:
                    raise TosakitError(f"method {name!r} keeps state {buffer!r} as {val.dtype} {list(val.shape)}, "
                                       f"another method as {shapes[buffer][0]} {list(shapes[buffer][1])}",
                                       "quantize the methods' state alike (the same quantization parameters)")
                if buffer not in pools.shared_state:
                    pools.shared_state[buffer] = pools.shared_bytes
                    pools.shared_bytes += -(-max(val.numel() * val.element_size(), 1) // ALIGNMENT) * ALIGNMENT
    plans = [Emitter(gm, pools).emit(i, o, name) for name, (gm, i, o) in methods.items()]
    return build_program(plans, pools, blocks_in_program)
