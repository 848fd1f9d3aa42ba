"""Write and read ExecuTorch ``.pte`` program files: an ``ET12`` flatbuffer, an optional
``eh00`` extended header, then 128-byte aligned data segments."""

from __future__ import annotations

import hashlib
import struct
from dataclasses import replace

from ..errors import TosakitError
from .flatbuf import Reader, build, corrupt
from .schema import DataLocation, DataSegment, Program

FILE_IDENTIFIER = b"ET12"
HEADER_MAGIC = b"eh00"
HEADER = struct.Struct("<4sIQQQ")  # magic, header length, program_size, segment_base_offset, segment_data_size
SEGMENT_ALIGNMENT = 128
TENSOR_ALIGNMENT = 16


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def _corrupt(message: str) -> TosakitError:
    return corrupt(".pte", message)


def _truncated(message: str) -> TosakitError:
    return TosakitError(f"truncated: {message}", "the file was cut short: write or copy it again")


# ------------------------------------------------------------------ writer


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

    flat = build(program, FILE_IDENTIFIER)
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

    reader = Reader(view, program_size)
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
