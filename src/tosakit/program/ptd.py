"""ExecuTorch's named-data file (``.ptd``: a FlatTensor flatbuffer, identifier ``FT01``, with an ``FH01``
header and 128-byte aligned segments): blobs stored by key — constant tensors with their layout, delegate blocks
without — that a program's tensors (``extra_tensor_info``, location EXTERNAL) and delegates (Vela's blocks) name."""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from ..errors import TosakitError
from .flatbuf import Reader, build, corrupt
from .schema import ELEMENT_TYPES, I32, STR, U8, U32, DataSegment, ScalarType, Vector, enum8, fb

FILE_IDENTIFIER = b"FT01"
HEADER_MAGIC = b"FH01"
# magic, header length, flatbuffer offset, flatbuffer size, segment base offset, segment data size
HEADER = struct.Struct("<4sIQQQQ")
HEADER_BLOCK = 48  # the header padded to 16, inserted after the root offset and identifier
VERSION = 0  # the newest version ExecuTorch 1.5.1 reads
SEGMENT_ALIGNMENT = 128


@dataclass
class TensorLayout:
    """A constant's element type, sizes and dim order, which the runtime checks against the program's tensor."""

    scalar_type: ScalarType = enum8(ScalarType)
    sizes: list[int] = fb(Vector(I32), factory=list)
    dim_order: list[int] = fb(Vector(U8), factory=list)

    @property
    def nbytes(self) -> int:
        return math.prod(self.sizes) * ELEMENT_TYPES[self.scalar_type][1]


@dataclass
class NamedData:
    key: str = fb(STR)
    segment_index: int = fb(U32, 0)
    tensor_layout: TensorLayout | None = fb(TensorLayout, None)


@dataclass
class FlatTensor:
    version: int = fb(U32, VERSION)
    segments: list[DataSegment] = fb(Vector(DataSegment), factory=list)
    named_data: list[NamedData] = fb(Vector(NamedData), factory=list)


@dataclass(frozen=True)
class NamedBlob:
    """One entry of a data map: its bytes, and the layout of the tensor it holds (None for an opaque blob)."""

    data: bytes
    layout: TensorLayout | None = None


def serialize_ptd(entries: dict[str, NamedBlob]) -> bytes:
    """The ``.ptd`` bytes of ``entries`` (key -> blob); equal blobs share one segment."""
    segments, table, named, offset = [], [], [], 0
    index: dict[bytes, int] = {}
    for key, blob in entries.items():
        if blob.data not in index:
            index[blob.data] = len(segments)
            offset = -(-offset // SEGMENT_ALIGNMENT) * SEGMENT_ALIGNMENT
            table.append(DataSegment(offset, len(blob.data)))
            segments.append(blob.data)
            offset += len(blob.data)
        named.append(NamedData(key, index[blob.data], blob.layout))
    flat = build(FlatTensor(VERSION, table, named), FILE_IDENTIFIER)
    base = -(-(len(flat) + HEADER_BLOCK) // SEGMENT_ALIGNMENT) * SEGMENT_ALIGNMENT
    header = HEADER.pack(HEADER_MAGIC, HEADER.size, HEADER_BLOCK, len(flat), base, offset)
    root = struct.unpack_from("<I", flat)[0] + HEADER_BLOCK
    out = bytearray(struct.pack("<I", root) + flat[4:8] + header.ljust(HEADER_BLOCK, b"\0") + flat[8:])
    for seg, data in zip(table, segments):
        out += bytes(base + seg.offset - len(out)) + data
    return bytes(out)


def deserialize_ptd(data: bytes) -> dict[str, NamedBlob]:
    """Read a ``.ptd`` whole and check it (header, version, every entry's segment inside the file, a tensor's
    bytes against its layout): key -> blob."""
    view = memoryview(bytes(data))
    if len(view) < 8 + HEADER.size or bytes(view[4:8]) != FILE_IDENTIFIER or bytes(view[8:12]) != HEADER_MAGIC:
        raise TosakitError(f"not a .ptd: it does not start with the {FILE_IDENTIFIER!r} identifier and "
                           f"{HEADER_MAGIC!r} header", "pass the named-data file (.ptd) written beside the program")
    _, length, flat_offset, flat_size, base, data_size = HEADER.unpack_from(view, 8)
    if length < HEADER.size or flat_offset < 8 + length or flat_offset + flat_size > base:
        raise corrupt(".ptd", f"header length {length}, flatbuffer at {flat_offset} ({flat_size} bytes) and "
                              f"segments at {base} do not fit together")
    if base + data_size > len(view):
        raise corrupt(".ptd", f"its segments end at byte {base + data_size}, the file has {len(view)} bytes")
    reader = Reader(view, flat_offset + flat_size, ".ptd")
    table = reader.table(FlatTensor, reader.follow(0, "root offset"))
    if table.version != VERSION:
        raise corrupt(".ptd", f"FlatTensor version {table.version}; ExecuTorch 1.5.1 reads version {VERSION}")
    out = {}
    for entry in table.named_data:
        if not entry.segment_index < len(table.segments):
            raise corrupt(".ptd", f"{entry.key!r} names segment {entry.segment_index} of {len(table.segments)}")
        seg = table.segments[entry.segment_index]
        if seg.offset + seg.size > data_size:
            raise corrupt(".ptd", f"{entry.key!r}'s segment ends at {seg.offset + seg.size}, past the "
                                  f"{data_size} bytes of segment data")
        blob = bytes(view[base + seg.offset: base + seg.offset + seg.size])
        layout = entry.tensor_layout
        if layout is not None:
            if layout.scalar_type not in ELEMENT_TYPES or any(s < 0 for s in layout.sizes) or \
                    sorted(layout.dim_order) != list(range(len(layout.sizes))):
                raise corrupt(".ptd", f"{entry.key!r} has layout {layout}")
            if layout.nbytes != len(blob):
                raise corrupt(".ptd", f"{entry.key!r} holds {len(blob)} bytes; its layout needs {layout.nbytes}")
        if entry.key in out:
            raise corrupt(".ptd", f"key {entry.key!r} appears twice")
        out[entry.key] = NamedBlob(blob, layout)
    return out
