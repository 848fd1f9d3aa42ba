"""ExecuTorch's ETDump (``etdump_schema_flatcc.fbs``, identifier ``ED00``, size-prefixed): what a runtime
recorded while it ran — one ``RunData`` block per load and per execute, holding profile events (a name, the
instruction's chain and index, delegate debug ids, start and end ticks) and debug events (a value: a tensor's
shape and its bytes' offset in a separate debug buffer). ExecuTorch's ``Inspector`` reads it."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from ..errors import TosakitError
from .flatbuf import Reader, build, corrupt
from .schema import I32, I32_UNSET, I64, STR, U32, U64, U8, Bool, Double, Int, Scalar, ScalarType, Vector, enum8, fb

FILE_IDENTIFIER = b"ED00"
VERSION = 0  # the version ExecuTorch's runtime writes
UNSET_CHAIN = (1 << 64) - 1  # a debug event's chain index outside any chain (program outputs): -1 as a uint64


class ValueType(enum.IntEnum):
    NULL = 0
    INT = 1
    BOOL = 2
    FLOAT = 3
    DOUBLE = 4
    TENSOR = 5
    TENSOR_LIST = 6
    STRING = 7


@dataclass
class Tensor:
    """A logged tensor: its type and shape; its bytes at ``offset`` in the debug buffer (-1: none)."""

    scalar_type: ScalarType = enum8(ScalarType)
    sizes: list[int] = fb(Vector(I64), factory=list)
    strides: list[int] = fb(Vector(I64), factory=list)
    offset: int = fb(I64, 0)


@dataclass
class TensorList:
    tensors: list[Tensor] = fb(Vector(Tensor), factory=list)


@dataclass
class Float:
    float_val: float = fb(Scalar("f"), 0.0)


@dataclass
class Value:
    """A logged value; ``output`` marks a program output."""

    val: ValueType = enum8(ValueType, ValueType.NULL)
    tensor: Tensor | None = fb(Tensor, None)
    tensor_list: TensorList | None = fb(TensorList, None)
    int_value: Int | None = fb(Int, None)
    float_value: Float | None = fb(Float, None)
    double_value: Double | None = fb(Double, None)
    bool_value: Bool | None = fb(Bool, None)
    output: Bool | None = fb(Bool, None)


@dataclass
class ProfileEvent:
    name: str | None = fb(STR, None)
    chain_index: int = fb(I32, 0)
    instruction_id: int = fb(I32_UNSET, -1)
    delegate_debug_id_int: int = fb(I32_UNSET, -1)
    delegate_debug_id_str: str | None = fb(STR, None)
    delegate_debug_metadata: bytes | None = fb(Vector(U8, raw=True), None)
    start_time: int = fb(U64, 0)
    end_time: int = fb(U64, 0)


@dataclass
class AllocationEvent:
    allocator_id: int = fb(I32, 0)
    allocation_size: int = fb(U64, 0)


@dataclass
class DebugEvent:
    chain_index: int = fb(U64, 0)
    instruction_id: int = fb(I32_UNSET, -1)
    debug_entry: Value | None = fb(Value, None)  # always there in a valid file
    delegate_debug_id_int: int = fb(I32_UNSET, -1)
    delegate_debug_id_str: str | None = fb(STR, None)
    name: str | None = fb(STR, None)


@dataclass
class Event:
    """One event: exactly one of its fields is set."""

    profile_event: ProfileEvent | None = fb(ProfileEvent, None)
    allocation_event: AllocationEvent | None = fb(AllocationEvent, None)
    debug_event: DebugEvent | None = fb(DebugEvent, None)


@dataclass
class Allocator:
    name: str = fb(STR)


@dataclass
class RunData:
    """One block: a load ("Default") or an execute ("Execute"); ``bundled_input_index`` names the bundled test case
    that ran (-1: none)."""

    name: str = fb(STR)
    bundled_input_index: int = fb(I32_UNSET, -1)
    allocators: list[Allocator] | None = fb(Vector(Allocator), None)
    events: list[Event] = fb(Vector(Event), factory=list)


@dataclass
class ETDump:
    version: int = fb(U32, VERSION)
    run_data: list[RunData] = fb(Vector(RunData), factory=list)


def is_etdump(data: bytes) -> bool:
    """Whether ``data`` holds an ETDump (a size prefix, then the root offset and ``ED00``)."""
    return bytes(data[8:12]) == FILE_IDENTIFIER


def serialize_etdump(dump: ETDump) -> bytes:
    """The ``.etdp`` bytes of ``dump``, size-prefixed as ExecuTorch's runtime writes them."""
    return build(dump, FILE_IDENTIFIER, size_prefixed=True)


def deserialize_etdump(data: bytes) -> ETDump:
    """Read an ``.etdp``: its size prefix against the file, then its tables, bounds-checked."""
    view = memoryview(bytes(data))
    if len(view) < 12 or not is_etdump(view):
        raise TosakitError(f"not an ETDump: file identifier is {bytes(view[8:12])!r}, expected {FILE_IDENTIFIER!r}",
                           "pass an ETDump file (.etdp), as `tosakit run --etdump` writes")
    size = struct.unpack_from("<I", view, 0)[0]
    if size != len(view) - 4:
        raise corrupt(".etdp", f"its size prefix says {size} bytes follow, the file has {len(view) - 4}")
    body = view[4:]
    reader = Reader(body, len(body), ".etdp")
    return reader.table(ETDump, reader.follow(0, "root offset"))
