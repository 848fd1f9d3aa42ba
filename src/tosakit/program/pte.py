"""Write and read ExecuTorch ``.pte`` program files: an ``ET12`` flatbuffer, an optional
``eh00`` extended header, then 128-byte aligned data segments."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import MISSING, dataclass, fields, replace

import flatbuffers
from flatbuffers import number_types as N

from ..errors import TosakitError
from .schema import (
    STR,
    DataLocation,
    DataSegment,
    Program,
    Scalar,
    Union,
    Vector,
    layout,
)

FILE_IDENTIFIER = b"ET12"
HEADER_MAGIC = b"eh00"
HEADER = struct.Struct("<4sIQQQ")  # magic, header length, program_size, segment_base_offset, segment_data_size
SEGMENT_ALIGNMENT = 128
TENSOR_ALIGNMENT = 16

_FLAGS = {
    "?": N.BoolFlags,
    "B": N.Uint8Flags,
    "b": N.Int8Flags,
    "i": N.Int32Flags,
    "I": N.Uint32Flags,
    "q": N.Int64Flags,
    "Q": N.Uint64Flags,
    "d": N.Float64Flags,
}


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _corrupt(message: str) -> TosakitError:
    return TosakitError(f"corrupt .pte: {message}", "regenerate the file; it was damaged or not written completely")


def _truncated(message: str) -> TosakitError:
    return TosakitError(f"truncated: {message}", "the file was cut short: write or copy it again")


# ------------------------------------------------------------------ writer


def _build_table(b: flatbuffers.Builder, obj) -> int:
    """Write one table (children first, as flatbuffers requires) and return its offset."""
    rows = layout(type(obj))
    children = {
        name: _build_child(b, kind, value, f"{type(obj).__name__}.{name}")
        for name, _, kind in rows
        if (value := getattr(obj, name)) is not None and not isinstance(kind, Scalar)
    }
    b.StartObject(sum(2 if isinstance(kind, Union) else 1 for _, _, kind in rows))
    for name, slot, kind in rows:
        value = getattr(obj, name)
        if value is None:
            continue
        if isinstance(kind, Scalar):
            b.PrependSlot(_FLAGS[kind.fmt], slot, value, 0)
        elif isinstance(kind, Union):
            b.PrependUint8Slot(slot, kind.members.index(type(value)) + 1, 0)
            b.PrependUOffsetTRelativeSlot(slot + 1, children[name], 0)
        else:
            b.PrependUOffsetTRelativeSlot(slot, children[name], 0)
    return b.EndObject()


def _build_child(b: flatbuffers.Builder, kind, value, where: str) -> int:
    """Write a string, vector, table or union member stored by offset."""
    if kind == STR:
        return b.CreateString(value)
    if isinstance(kind, Union):
        if type(value) not in kind.members:
            raise TosakitError(f"{where} cannot hold a {type(value).__name__}",
                               f"use one of {', '.join(m.__name__ for m in kind.members)}")
        return _build_table(b, value)
    if not isinstance(kind, Vector):
        return _build_table(b, value)
    if isinstance(kind.of, Scalar):
        payload = bytes(value) if kind.raw else struct.pack(f"<{len(value)}{kind.of.fmt}", *value)
        width = struct.calcsize(kind.of.fmt)
        b.StartVector(width, len(value), max(width, kind.align))
        b.head = b.Head() - len(payload)
        b.Bytes[b.Head() : b.Head() + len(payload)] = payload
        return b.EndVector()
    offsets = [_build_table(b, item) for item in value]
    b.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        b.PrependUOffsetTRelative(offset)
    return b.EndVector()


def _check_references(program: Program) -> None:
    """Every segment / inline-data index the program names must exist."""
    n_segments, n_inline = len(program.segments), len(program.backend_delegate_data)
    refs = [("constant_segment", program.constant_segment.segment_index)] if program.constant_segment else []
    refs += [(f"named_data {d.key!r}", d.segment_index) for d in program.named_data or []]
    refs += [(f"mutable_data_segments[{i}]", s.segment_index) for i, s in enumerate(program.mutable_data_segments or [])]
    for plan in program.execution_plan:
        for d in plan.delegates:
            if d.processed.location == DataLocation.INLINE and not d.processed.index < n_inline:
                raise TosakitError(
                    f"delegate {d.id!r} of {plan.name!r} uses inline data {d.processed.index}, "
                    f"but the program has {n_inline} backend_delegate_data entries"
                )
            if d.processed.location == DataLocation.SEGMENT:
                refs.append((f"delegate {d.id!r}", d.processed.index))
    for what, index in refs:
        if not index < n_segments:
            raise TosakitError(
                f"{what} refers to segment {index}, but there are only {n_segments} segments",
                "pass every segment's bytes to serialize_pte (b'' for an empty constant segment)",
            )


def serialize_pte(program: Program, segments: list[bytes]) -> bytes:
    """The ``.pte`` bytes of ``program`` followed by ``segments``.

    ``program.segments`` is ignored and recomputed from ``segments``; with no segments at all,
    one empty segment (``[{0, 0}]``) is written for the empty constant segment the runtime expects.
    """
    segments = [bytes(s) for s in segments] or [b""]
    table, offset = [], 0
    for data in segments:
        table.append(DataSegment(offset, len(data)))
        offset += _align(len(data), SEGMENT_ALIGNMENT)
    program = replace(program, segments=table)
    _check_references(program)

    builder = flatbuffers.Builder(1024)
    builder.Finish(_build_table(builder, program), file_identifier=FILE_IDENTIFIER)
    flat = bytes(builder.Output())
    if offset == 0:
        return flat

    program_size = len(flat) + HEADER.size
    base = _align(program_size, SEGMENT_ALIGNMENT)
    root = struct.unpack_from("<I", flat)[0] + HEADER.size
    header = HEADER.pack(HEADER_MAGIC, HEADER.size, program_size, base, offset)
    out = bytearray(struct.pack("<I", root) + flat[4:8] + header + flat[8:])
    out += bytes(base - program_size)
    for data in segments:
        out += data + bytes(_align(len(data), SEGMENT_ALIGNMENT) - len(data))
    return bytes(out)


def tosa_key(processed: bytes) -> str:
    """Named-data key of a delegate's TOSA (carried with --debug-info): found from the payload itself."""
    return f"tosakit.tosa.{hashlib.sha256(processed).hexdigest()[:24]}"


def constant_segment_bytes(tensors: list[bytes]) -> tuple[bytes, list[int]]:
    """Pack constant tensors (each padded to 16 bytes) into one segment.

    Returns the segment and ``constant_segment.offsets``: ``offsets[0]`` is the reserved 0 and
    the tensor with ``data_buffer_idx = i`` (1-based) starts at ``offsets[i]``.
    """
    data, offsets = bytearray(), [0]
    for tensor in tensors:
        offsets.append(len(data))
        data += tensor + bytes(_align(len(tensor), TENSOR_ALIGNMENT) - len(tensor))
    return bytes(data), offsets


# ------------------------------------------------------------------ reader


@dataclass
class _Reader:
    """Bounds-checked flatbuffer decoding over the first ``size`` bytes of ``data``."""

    data: memoryview
    size: int

    def unpack(self, fmt: str, pos: int, where: str) -> tuple:
        if pos < 0 or pos + struct.calcsize(fmt) > self.size:
            raise _corrupt(f"{where} points to byte {pos}, outside the {self.size}-byte program")
        return struct.unpack_from(fmt, self.data, pos)

    def follow(self, pos: int, where: str) -> int:
        """The position a uoffset stored at ``pos`` points to (a table or a vector: 4 bytes at least)."""
        target = pos + self.unpack("<I", pos, where)[0]
        self.unpack("<I", target, where)
        return target

    def vector(self, pos: int, width: int, where: str) -> tuple[int, int]:
        """Start and length of the vector referenced at ``pos``."""
        start = self.follow(pos, where)
        n = self.unpack("<I", start, where)[0]
        if start + 4 + n * width > self.size:
            raise _corrupt(f"{where} has {n} elements, running past the end of the {self.size}-byte program")
        return start + 4, n

    def table(self, cls: type, pos: int):
        name = cls.__name__
        vtable = pos - self.unpack("<i", pos, name)[0]
        vtable_size = self.unpack("<H", vtable, f"{name} vtable")[0]

        def at(slot: int) -> int:
            """Position of the field in ``slot``, 0 when absent."""
            if 4 + 2 * slot + 2 > vtable_size:
                return 0
            offset = self.unpack("<H", vtable + 4 + 2 * slot, f"{name} vtable")[0]
            return offset and pos + offset

        values = {}
        for f, (field_name, slot, kind) in zip(fields(cls), layout(cls)):
            where = f"{name}.{field_name}"
            if isinstance(kind, Union):
                values[field_name] = self.union(kind, at(slot), at(slot + 1), where)
            elif at(slot) or isinstance(kind, Scalar):
                values[field_name] = self.value(kind, at(slot), where)
            else:
                values[field_name] = _default(f, where)
        return cls(**values)

    def scalar(self, kind: Scalar, raw, where: str):
        if kind.as_enum is None:
            return raw
        try:
            return kind.as_enum(raw)
        except ValueError:
            raise _corrupt(f"{where} is {raw}, not a valid {kind.as_enum.__name__}") from None

    def union(self, kind: Union, type_at: int, value_at: int, where: str):
        tag = self.unpack("<B", type_at, where)[0] if type_at else 0
        if tag == 0:
            raise _corrupt(f"{where} is missing")
        if tag > len(kind.members):
            raise _corrupt(f"{where} has union type {tag}, but only 1..{len(kind.members)} exist")
        if not value_at:
            raise _corrupt(f"{where} has union type {tag} but no value")
        return self.table(kind.members[tag - 1], self.follow(value_at, where))

    def value(self, kind, at: int, where: str):
        if isinstance(kind, Scalar):
            raw = self.unpack("<" + kind.fmt, at, where)[0] if at else _zero(kind)
            return self.scalar(kind, raw, where)
        if kind == STR:
            start, n = self.vector(at, 1, where)
            try:
                return str(self.data[start : start + n], "utf-8")
            except UnicodeDecodeError:
                raise _corrupt(f"{where} is not valid UTF-8") from None
        if not isinstance(kind, Vector):
            return self.table(kind, self.follow(at, where))
        if isinstance(kind.of, Scalar):
            start, n = self.vector(at, struct.calcsize(kind.of.fmt), where)
            if kind.raw:
                return bytes(self.data[start : start + n])
            return [self.scalar(kind.of, v, where) for v in struct.unpack_from(f"<{n}{kind.of.fmt}", self.data, start)]
        start, n = self.vector(at, 4, where)
        return [self.table(kind.of, self.follow(start + 4 * i, where)) for i in range(n)]


def _zero(kind: Scalar):
    """An absent scalar's value: the schema default, always zero here (False, 0, 0.0)."""
    return struct.unpack("<" + kind.fmt, bytes(struct.calcsize(kind.fmt)))[0]


def _default(f, where: str):
    """The dataclass default of an absent field; a required table, vector or string must be there."""
    if f.default_factory is not MISSING:
        return f.default_factory()
    if f.default is MISSING:
        raise _corrupt(f"{where} is missing")
    return f.default


def deserialize_pte(data: bytes) -> tuple[Program, list[bytes]]:
    """Read a ``.pte`` (ours or ExecuTorch's): the program and the bytes of each segment."""
    view = memoryview(bytes(data))
    if len(view) < 8:
        raise _truncated(f"a .pte needs at least 8 bytes, the file has {len(view)}")
    if bytes(view[4:8]) != FILE_IDENTIFIER:
        raise TosakitError(
            f"not a .pte: file identifier is {bytes(view[4:8])!r}, expected {FILE_IDENTIFIER!r}",
            "pass an ExecuTorch program file (.pte)",
        )
    program_size, base, data_size = len(view), None, 0
    if bytes(view[8:12]) == HEADER_MAGIC:
        if len(view) < 8 + HEADER.size:
            raise _truncated(f"the extended header ends at byte {8 + HEADER.size} but the file has {len(view)} bytes")
        _, length, program_size, base, data_size = HEADER.unpack_from(view, 8)
        if length < HEADER.size:
            raise _corrupt(f"extended header length is {length}, expected at least {HEADER.size}")
        if not 8 + length <= program_size <= base:
            raise _corrupt(f"extended header has program_size {program_size} and segment_base_offset {base}, "
                           f"which do not fit a {length}-byte header")
        if program_size > len(view):
            raise _truncated(f"the program ends at byte {program_size} but the file has {len(view)} bytes")

    reader = _Reader(view, program_size)
    program = reader.table(Program, reader.follow(0, "root offset"))
    try:
        _check_references(program)
    except TosakitError as e:
        raise _corrupt(e.message) from None

    segments = []
    for i, seg in enumerate(program.segments):
        if base is None and seg.size:
            raise _corrupt(f"segment {i} holds {seg.size} bytes, but the file has no extended header to locate it")
        start = (base or 0) + seg.offset
        if start + seg.size > len(view):
            raise _truncated(f"segment {i} ends at byte {start + seg.size} but the file has {len(view)} bytes")
        segments.append(bytes(view[start : start + seg.size]))
    if base is not None and base + data_size > len(view):
        raise _truncated(f"the segment data ends at byte {base + data_size} but the file has {len(view)} bytes")
    return program, segments
