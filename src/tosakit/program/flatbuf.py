"""Flatbuffer tables as the schema dataclasses declare them (``schema.fb``): a writer, and a bounds-checked
reader whose errors name the file's kind (.pte, .bpte, ...)."""

from __future__ import annotations

import struct
from dataclasses import MISSING, dataclass, fields

import flatbuffers
from flatbuffers import number_types as N

from ..errors import TosakitError
from .schema import STR, Scalar, Union, Vector, layout

_FLAGS = {
    "?": N.BoolFlags,
    "B": N.Uint8Flags,
    "b": N.Int8Flags,
    "i": N.Int32Flags,
    "I": N.Uint32Flags,
    "q": N.Int64Flags,
    "f": N.Float32Flags,
    "Q": N.Uint64Flags,
    "d": N.Float64Flags,
}



def corrupt(kind: str, message: str) -> TosakitError:
    return TosakitError(f"corrupt {kind}: {message}", "regenerate the file; it was damaged or not written completely")


def build(root, identifier: bytes, size_prefixed: bool = False) -> bytes:
    """The flatbuffer bytes of table ``root`` with a 4-byte file ``identifier`` (after a u32 size prefix when
    ``size_prefixed``)."""
    builder = flatbuffers.Builder(1024)
    finish = builder.FinishSizePrefixed if size_prefixed else builder.Finish
    finish(_build_table(builder, root), file_identifier=identifier)
    return bytes(builder.Output())


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
            b.PrependSlot(_FLAGS[kind.fmt], slot, value, kind.default)
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


@dataclass
class Reader:
    """Bounds-checked flatbuffer decoding over the first ``size`` bytes of ``data``."""

    data: memoryview
    size: int
    kind: str = ".pte"  # the file's kind, for errors

    def corrupt(self, message: str) -> TosakitError:
        return corrupt(self.kind, message)

    def unpack(self, fmt: str, pos: int, where: str) -> tuple:
        if pos < 0 or pos + struct.calcsize(fmt) > self.size:
            raise self.corrupt(f"{where} points to byte {pos}, outside the {self.size}-byte program")
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
            raise self.corrupt(f"{where} has {n} elements, running past the end of the {self.size}-byte program")
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
                values[field_name] = self.default(f, where)
        return cls(**values)

    def default(self, f, where: str):
        """The dataclass default of an absent field; a required table, vector or string must be there."""
        if f.default_factory is not MISSING:
            return f.default_factory()
        if f.default is MISSING:
            raise self.corrupt(f"{where} is missing")
        return f.default

    def scalar(self, kind: Scalar, raw, where: str):
        if kind.as_enum is None:
            return raw
        try:
            return kind.as_enum(raw)
        except ValueError:
            raise self.corrupt(f"{where} is {raw}, not a valid {kind.as_enum.__name__}") from None

    def union(self, kind: Union, type_at: int, value_at: int, where: str):
        tag = self.unpack("<B", type_at, where)[0] if type_at else 0
        if tag == 0:
            raise self.corrupt(f"{where} is missing")
        if tag > len(kind.members):
            raise self.corrupt(f"{where} has union type {tag}, but only 1..{len(kind.members)} exist")
        if not value_at:
            raise self.corrupt(f"{where} has union type {tag} but no value")
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
                raise self.corrupt(f"{where} is not valid UTF-8") from None
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
    """An absent scalar's value: the schema default (False, 0, 0.0 unless the kind says otherwise)."""
    return kind.default or struct.unpack("<" + kind.fmt, bytes(struct.calcsize(kind.fmt)))[0]
