"""ExecuTorch's program schema (program.fbs) as dataclasses: fields in schema order, so a field's
position is its flatbuffer slot (a union takes two), and its ``kind`` metadata says how it is stored."""

from __future__ import annotations

import enum
import functools
from dataclasses import MISSING, dataclass, field, fields

from ..errors import TosakitError
from ..specs import CompileSpec


class ScalarType(enum.IntEnum):
    """Element types (``scalar_type.fbs``); the values are ExecuTorch's, not torch's."""

    BYTE = 0
    CHAR = 1
    SHORT = 2
    INT = 3
    LONG = 4
    HALF = 5
    FLOAT = 6
    DOUBLE = 7
    BOOL = 11
    QINT8 = 12
    QUINT8 = 13
    QINT32 = 14
    BFLOAT16 = 15
    QUINT4X2 = 16
    QUINT2X4 = 17
    BITS16 = 22
    FLOAT8E5M2 = 23
    FLOAT8E4M3FN = 24
    FLOAT8E5M2FNUZ = 25
    FLOAT8E4M3FNUZ = 26
    UINT16 = 27
    UINT32 = 28
    UINT64 = 29


class TensorShapeDynamism(enum.IntEnum):
    STATIC = 0
    DYNAMIC_BOUND = 1
    DYNAMIC_UNBOUND = 2


class TensorDataLocation(enum.IntEnum):
    SEGMENT = 0
    EXTERNAL = 1


class DeviceType(enum.IntEnum):
    CPU = 0
    CUDA = 1


class DataLocation(enum.IntEnum):
    """Where a delegate's processed blob lives: ``Program.backend_delegate_data`` or ``Program.segments``."""

    INLINE = 0
    SEGMENT = 1


# ------------------------------------------------------------------ field kinds


@dataclass(frozen=True)
class Scalar:
    """A number stored in the table itself; ``struct`` format, an enum to read it as, and the schema's default
    (left out when written, read when absent)."""

    fmt: str
    as_enum: type | None = None
    default: int = 0


@dataclass(frozen=True)
class Vector:
    """A vector of scalars or tables; ``raw`` keeps a ubyte vector as ``bytes``; ``align`` forces alignment."""

    of: object
    align: int = 0
    raw: bool = False


@dataclass(frozen=True)
class Union:
    """A union: a ubyte type slot (1-based index into ``members``) followed by the value slot."""

    members: tuple


BOOL, U8, I8, I32, U32, I64, U64, F64 = (Scalar(f) for f in "?BbiIqQd")
I32_UNSET = Scalar("i", default=-1)  # an int field whose schema default is -1 (ETDump's ids)
STR = "string"
BYTES = Vector(U8, raw=True)


def fb(kind, default=MISSING, factory=MISSING):
    """A dataclass field with its flatbuffer kind attached."""
    return field(default=default, default_factory=factory, metadata={"kind": kind})


def enum8(cls, default=MISSING):
    """A dataclass field holding a one-byte schema enum, read back as ``cls``."""
    return fb(Scalar("b", cls), default)


# ------------------------------------------------------------------ tables


@dataclass
class ContainerMetadata:
    encoded_inp_str: str | None = fb(STR, None)
    encoded_out_str: str | None = fb(STR, None)


@dataclass
class Null:
    pass


@dataclass
class AllocationDetails:
    """Where a memory-planned tensor lives: arena ``memory_id`` (1-based) at a 64-bit offset."""

    memory_id: int = fb(U32)
    memory_offset_low: int = fb(U32, 0)
    memory_offset_high: int = fb(U32, 0)


@dataclass
class ExtraTensorInfo:
    mutable_data_segments_idx: int = fb(U64, 0)
    fully_qualified_name: str | None = fb(STR, None)
    location: TensorDataLocation = enum8(TensorDataLocation, TensorDataLocation.SEGMENT)
    device_type: DeviceType = enum8(DeviceType, DeviceType.CPU)
    device_index: int = fb(I8, 0)


@dataclass
class Tensor:
    """A tensor value: constant (data_buffer_idx > 0), memory-planned, or bound by the caller."""

    scalar_type: ScalarType = enum8(ScalarType)
    storage_offset: int = fb(I32, 0)
    sizes: list[int] = fb(Vector(I32), factory=list)
    dim_order: list[int] = fb(Vector(U8), factory=list)
    requires_grad: bool = fb(BOOL, False)
    data_buffer_idx: int = fb(U32, 0)
    allocation_info: AllocationDetails | None = fb(AllocationDetails, None)
    layout: int = fb(I8, 0)
    shape_dynamism: TensorShapeDynamism = enum8(TensorShapeDynamism, TensorShapeDynamism.STATIC)
    extra_tensor_info: ExtraTensorInfo | None = fb(ExtraTensorInfo, None)


@dataclass
class Int:
    int_val: int = fb(I64)


@dataclass
class Bool:
    bool_val: bool = fb(BOOL)


@dataclass
class Double:
    double_val: float = fb(F64)


@dataclass
class String:
    string_val: str = fb(STR)


@dataclass
class IntList:
    items: list[int] = fb(Vector(I64))


@dataclass
class DoubleList:
    items: list[float] = fb(Vector(F64))


@dataclass
class BoolList:
    items: list[bool] = fb(Vector(BOOL))


@dataclass
class TensorList:
    """Indices of the member tensors in ``ExecutionPlan.values``."""

    items: list[int] = fb(Vector(I32))


@dataclass
class OptionalTensorList:
    """Like ``TensorList``, but an index may point to a ``Null`` value."""

    items: list[int] = fb(Vector(I32))


KERNEL_TYPES = (Null, Int, Bool, Double, Tensor, String, IntList, DoubleList, BoolList, TensorList, OptionalTensorList)


@dataclass
class EValue:
    val: object = fb(Union(KERNEL_TYPES))


@dataclass
class Operator:
    """A kernel the runtime resolves by name, e.g. ``Operator("aten::add", "out")``."""

    name: str = fb(STR)
    overload: str = fb(STR, "")


@dataclass
class KernelCall:
    """Call ``operators[op_index]`` with value indices: the ``.out`` schema args, then the output again."""

    op_index: int = fb(I32)
    args: list[int] = fb(Vector(I32))


@dataclass
class DelegateCall:
    """Run ``delegates[delegate_index]``; args are the inputs, then the flattened outputs."""

    delegate_index: int = fb(I32)
    args: list[int] = fb(Vector(I32))


@dataclass
class MoveCall:
    move_from: int = fb(I32)
    move_to: int = fb(I32)


@dataclass
class JumpFalseCall:
    cond_value_index: int = fb(I32)
    destination_instruction: int = fb(I32)


@dataclass
class FreeCall:
    value_index: int = fb(I32)


@dataclass
class Instruction:
    instr_args: object = fb(Union((KernelCall, DelegateCall, MoveCall, JumpFalseCall, FreeCall)))


@dataclass
class Frame:
    filename: str | None = fb(STR, None)
    lineno: int = fb(I32, 0)
    name: str | None = fb(STR, None)
    context: str | None = fb(STR, None)


@dataclass
class FrameList:
    items: list[Frame] = fb(Vector(Frame), factory=list)


@dataclass
class BackendDelegateDataReference:
    location: DataLocation = enum8(DataLocation)
    index: int = fb(U32)


@dataclass
class BackendDelegate:
    """A delegate: backend ``id`` (as registered in the runtime), its blob, its compile specs."""

    id: str = fb(STR)
    processed: BackendDelegateDataReference = fb(BackendDelegateDataReference)
    compile_specs: list[CompileSpec] = fb(Vector(CompileSpec), factory=list)


@dataclass
class Chain:
    inputs: list[int] = fb(Vector(I32))
    outputs: list[int] = fb(Vector(I32))
    instructions: list[Instruction] = fb(Vector(Instruction))
    stacktrace: list[FrameList] | None = fb(Vector(FrameList), None)


@dataclass
class NonConstBufferDevice:
    buffer_idx: int = fb(I32)
    device_type: DeviceType = enum8(DeviceType, DeviceType.CPU)
    device_index: int = fb(I8, 0)


@dataclass
class ExecutionPlan:
    """One method; ``non_const_buffer_sizes[0]`` is a reserved 0, entries 1.. are the arena sizes."""

    name: str = fb(STR)
    container_meta_type: ContainerMetadata | None = fb(ContainerMetadata, None)
    values: list[EValue] = fb(Vector(EValue), factory=list)
    inputs: list[int] = fb(Vector(I32), factory=list)
    outputs: list[int] = fb(Vector(I32), factory=list)
    chains: list[Chain] = fb(Vector(Chain), factory=list)
    operators: list[Operator] = fb(Vector(Operator), factory=list)
    delegates: list[BackendDelegate] = fb(Vector(BackendDelegate), factory=list)
    non_const_buffer_sizes: list[int] = fb(Vector(I64), factory=lambda: [0])
    non_const_buffer_device: list[NonConstBufferDevice] | None = fb(Vector(NonConstBufferDevice), None)


@dataclass
class Buffer:
    """Deprecated inline constant storage (``Program.constant_buffer``); kept only to read old files."""

    storage: bytes = fb(Vector(U8, align=16, raw=True), b"")


@dataclass
class BackendDelegateInlineData:
    data: bytes = fb(Vector(U8, align=16, raw=True))


@dataclass
class DataSegment:
    """A byte range after the flatbuffer, relative to the extended header's segment_base_offset."""

    offset: int = fb(U64)
    size: int = fb(U64)


@dataclass
class SubsegmentOffsets:
    """Byte offsets into ``segments[segment_index]``; ``offsets[0]`` is reserved (0)."""

    segment_index: int = fb(U32)
    offsets: list[int] = fb(Vector(U64))


@dataclass
class NamedData:
    key: str = fb(STR)
    segment_index: int = fb(U32)


@dataclass
class Program:
    """The root table. ``segments`` is filled in by ``serialize_pte`` from the segment bytes."""

    version: int = fb(U32, 0)
    execution_plan: list[ExecutionPlan] = fb(Vector(ExecutionPlan), factory=list)
    constant_buffer: list[Buffer] = fb(Vector(Buffer), factory=list)
    backend_delegate_data: list[BackendDelegateInlineData] = fb(Vector(BackendDelegateInlineData), factory=list)
    segments: list[DataSegment] = fb(Vector(DataSegment), factory=list)
    constant_segment: SubsegmentOffsets | None = fb(SubsegmentOffsets, factory=lambda: SubsegmentOffsets(0, [0]))
    mutable_data_segments: list[SubsegmentOffsets] | None = fb(Vector(SubsegmentOffsets), None)
    named_data: list[NamedData] = fb(Vector(NamedData), factory=list)


# The shared ``CompileSpec`` dataclass (key, value bytes) is the schema table of the same name.
_LAYOUTS: dict[type, tuple] = {CompileSpec: (("key", 0, STR), ("value", 1, BYTES))}


def layout(table: type) -> tuple[tuple[str, int, object], ...]:
    """(field name, first slot, kind) of each field of a table, in schema order."""
    if table not in _LAYOUTS:
        rows, slot = [], 0
        for f in fields(table):
            rows.append((f.name, slot, f.metadata["kind"]))
            slot += 2 if isinstance(f.metadata["kind"], Union) else 1
        _LAYOUTS[table] = tuple(rows)
    return _LAYOUTS[table]


# ------------------------------------------------------------------ element types

# name (torch and numpy spell them alike, bool aside) and bytes per element, of the types a program may hold
ELEMENT_TYPES: dict[ScalarType, tuple[str, int]] = {
    ScalarType.BYTE: ("uint8", 1),
    ScalarType.CHAR: ("int8", 1),
    ScalarType.SHORT: ("int16", 2),
    ScalarType.INT: ("int32", 4),
    ScalarType.LONG: ("int64", 8),
    ScalarType.HALF: ("float16", 2),
    ScalarType.FLOAT: ("float32", 4),
    ScalarType.DOUBLE: ("float64", 8),
    ScalarType.BOOL: ("bool", 1),
    ScalarType.QINT8: ("qint8", 1),
    ScalarType.QUINT8: ("quint8", 1),
    ScalarType.QINT32: ("qint32", 4),
    ScalarType.BFLOAT16: ("bfloat16", 2),
    ScalarType.QUINT4X2: ("quint4x2", 1),
    ScalarType.QUINT2X4: ("quint2x4", 1),
    ScalarType.BITS16: ("bits16", 2),
    ScalarType.FLOAT8E5M2: ("float8_e5m2", 1),
    ScalarType.FLOAT8E4M3FN: ("float8_e4m3fn", 1),
    ScalarType.FLOAT8E5M2FNUZ: ("float8_e5m2fnuz", 1),
    ScalarType.FLOAT8E4M3FNUZ: ("float8_e4m3fnuz", 1),
    ScalarType.UINT16: ("uint16", 2),
    ScalarType.UINT32: ("uint32", 4),
    ScalarType.UINT64: ("uint64", 8),
}


@functools.lru_cache(maxsize=None)
def _torch_dtypes() -> dict:
    import torch

    return {st: getattr(torch, name) for st, (name, _) in ELEMENT_TYPES.items()}


def scalar_type_of(dtype) -> ScalarType:
    """The ExecuTorch scalar type of a torch dtype."""
    for st, d in _torch_dtypes().items():
        if d == dtype:
            return st
    raise TosakitError(f"dtype {dtype} has no ExecuTorch scalar type",
                       f"use one of: {', '.join('torch.' + name for name, _ in ELEMENT_TYPES.values())}")


def torch_dtype_of(scalar_type: ScalarType | int):
    """The torch dtype of an ExecuTorch scalar type."""
    try:
        return _torch_dtypes()[ScalarType(scalar_type)]
    except ValueError:
        raise TosakitError(f"unknown ExecuTorch scalar type {scalar_type!r}") from None
