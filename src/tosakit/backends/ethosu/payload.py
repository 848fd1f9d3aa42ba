"""The Ethos-U delegate payload: Vela's output as a stream of named, 16-byte aligned blocks.

Layout (see FORMATS.md, "Arm Ethos-U delegate payload"): each block is a
16-byte NUL-padded name, a u32 data size, a u8 external flag, 11 zero bytes,
then the data padded with zeros to a multiple of 16. Little-endian.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass

from ...errors import TosakitError
from .vela import VELA_SHAPE_DIMS, VelaResult, VelaTensor

BLOCK_ORDER = (
    "vela_bin_stream",
    "cmd_data",
    "weight_data",
    "scratch_size",
    "inputs",
    "outputs",
    "vela_end_stream",
)
_HEADER = struct.Struct("<16sIB11s")
_TENSOR = struct.Struct(f"<{VELA_SHAPE_DIMS}iiii")
_COUNT = struct.Struct("<i")
_U32 = struct.Struct("<I")
_ALIGN = 16
_ELEM_SIZES = (1, 2, 4)
EXTERNAL_KEY_BYTES = 64  # an external block holds its key: sha256 in lowercase hex


@dataclass
class EthosUPayload:
    """A parsed delegate payload."""

    cmd_data: bytes
    weight_data: bytes
    scratch_size: int
    inputs: list[VelaTensor]
    outputs: list[VelaTensor]
    blocks: list[tuple[str, int]]  # (name, unpadded size), in file order


def _padded(size: int) -> int:
    return -(-size // _ALIGN) * _ALIGN


def _check_elem_size(tensor: VelaTensor, where: str) -> None:
    if tensor.elem_size not in _ELEM_SIZES:
        raise TosakitError(
            f"Ethos-U delegate {where} has {tensor.elem_size}-byte elements",
            "delegate inputs and outputs must be integers of 1, 2 or 4 bytes: quantize them",
        )


# ------------------------------------------------------------------------ pack


def _block(name: str, data: bytes) -> bytes:
    header = _HEADER.pack(name.encode("ascii"), len(data), 0, b"")
    return header + data + bytes(_padded(len(data)) - len(data))


def _pack_tensors(tensors: list[VelaTensor], kind: str) -> bytes:
    out = _COUNT.pack(len(tensors))
    for i, t in enumerate(tensors):
        if len(t.shape) != VELA_SHAPE_DIMS:
            raise TosakitError(f"Ethos-U delegate {kind}[{i}] has shape {t.shape}",
                               f"Vela shapes have exactly {VELA_SHAPE_DIMS} dimensions")
        _check_elem_size(t, f"{kind}[{i}]")
        out += _TENSOR.pack(*t.shape, t.elem_size, t.offset, t.region)
    return out


def pack_payload(result: VelaResult) -> bytes:
    """The delegate blob for one Vela compilation."""
    data = {
        "vela_bin_stream": b"",
        "cmd_data": result.cmd_data,
        "weight_data": result.weight_data,
        "scratch_size": _U32.pack(result.scratch_size),
        "inputs": _pack_tensors(result.inputs, "input"),
        "outputs": _pack_tensors(result.outputs, "output"),
        "vela_end_stream": b"",
    }
    return b"".join(_block(name, data[name]) for name in BLOCK_ORDER)


# ----------------------------------------------------------------------- parse


def _bad(message: str) -> TosakitError:
    return TosakitError(f"invalid Ethos-U delegate payload: {message}",
                        "the blob is damaged or was not written by Vela/tosakit: compile the model again")


def _read_name(raw: bytes, offset: int) -> str:
    name, nul, rest = raw.partition(b"\0")
    if not nul or rest.strip(b"\0"):
        raise _bad(f"block name at byte {offset} is not a NUL-terminated string: {raw!r}")
    try:
        return name.decode("ascii")
    except UnicodeDecodeError:
        raise _bad(f"block name at byte {offset} is not ASCII: {raw!r}") from None


def external_key(tag: str, data: bytes) -> str:
    """The named-data key ExecuTorch gives a block placed outside the payload under ``tag``."""
    return hashlib.sha256(tag.encode("ascii") + b"\0" + data).hexdigest()


def place_external(blob: bytes, placements: dict[str, str]) -> tuple[bytes, dict[str, tuple[str, bytes]]]:
    """``blob`` with each block ``placements`` names (block -> tag) replaced by its key, as ExecuTorch's Ethos-U
    backend writes it: the new payload, and key -> (tag, data) of what moved."""
    out, moved, offset = bytearray(), {}, 0
    while offset < len(blob):
        raw_name, size, _, _ = _HEADER.unpack_from(blob, offset)
        name = raw_name.rstrip(b"\0").decode("ascii")
        data = blob[offset + _HEADER.size: offset + _HEADER.size + size]
        if name in placements:
            key = external_key(placements[name], data)
            moved[key] = (placements[name], bytes(data))
            out += _HEADER.pack(raw_name, len(key), 1, b"") + key.encode("ascii")
        else:
            out += blob[offset: offset + _HEADER.size + _padded(size)]
        offset += _HEADER.size + _padded(size)
    return bytes(out), moved


def inline_external(blob: bytes, lookup) -> bytes:
    """``blob`` with each external block's data fetched by its key from ``lookup`` (key -> bytes or None), as
    ExecuTorch's runtime resolves them; unchanged when no block is external; a block whose key nothing holds
    stays external (``parse_payload`` names it)."""
    out, offset, changed = bytearray(), 0, False
    while offset + _HEADER.size <= len(blob):
        raw_name, size, external, reserved = _HEADER.unpack_from(blob, offset)
        end = offset + _HEADER.size + _padded(size)
        data = blob[offset + _HEADER.size: offset + _HEADER.size + size]
        found = lookup(bytes(data).decode("ascii", "replace")) if external == 1 and size == EXTERNAL_KEY_BYTES else None
        if found is None:
            out += blob[offset:end]
        else:
            out += _HEADER.pack(raw_name, len(found), 0, reserved) + found + bytes(_padded(len(found)) - len(found))
            changed = True
        offset = end
    return bytes(out + blob[offset:]) if changed else blob


def _split_blocks(blob: bytes) -> list[tuple[str, bytes]]:
    """Cut the blob into (name, data) pairs, checking headers, order, sizes and padding."""
    blocks, offset = [], 0
    while offset < len(blob):
        if len(blob) - offset < _HEADER.size:
            raise _bad(f"truncated block header at byte {offset} ({len(blob) - offset} bytes left)")
        raw_name, size, external, reserved = _HEADER.unpack_from(blob, offset)
        name = _read_name(raw_name, offset)
        if name not in BLOCK_ORDER:
            raise _bad(f"unknown block {name!r} at byte {offset} (known: {', '.join(BLOCK_ORDER)})")
        if name != BLOCK_ORDER[len(blocks)]:
            raise _bad(f"block {len(blocks)} is {name!r}, expected {BLOCK_ORDER[len(blocks)]!r} "
                       f"(order: {', '.join(BLOCK_ORDER)})")
        if external:
            raise TosakitError(f"Ethos-U delegate payload: block {name!r} keeps its data outside the payload "
                               f"(external flag {external}), and no data file given holds it",
                               "pass the program's named-data file: tosakit run X.pte --data X.ptd")
        if any(reserved):
            raise _bad(f"block {name!r} has non-zero reserved header bytes")
        start = offset + _HEADER.size
        end = start + _padded(size)
        if end > len(blob):
            raise _bad(f"block {name!r} at byte {offset} needs {_padded(size)} data bytes, "
                       f"only {len(blob) - start} remain")
        if any(blob[start + size:end]):
            raise _bad(f"block {name!r} has non-zero padding")
        blocks.append((name, blob[start:start + size]))
        if name == BLOCK_ORDER[-1]:
            if end != len(blob):
                raise _bad(f"{len(blob) - end} bytes follow the vela_end_stream block")
            return blocks
        offset = end
    raise _bad(f"the blob ends before block {BLOCK_ORDER[len(blocks)]!r}")


def _parse_tensors(data: bytes, kind: str) -> list[VelaTensor]:
    if len(data) < _COUNT.size:
        raise _bad(f"{kind} block is {len(data)} bytes, too short for a count")
    (count,) = _COUNT.unpack_from(data)
    if count < 0 or len(data) != _COUNT.size + count * _TENSOR.size:
        raise _bad(f"{kind} block is {len(data)} bytes but declares {count} tensors "
                   f"({_COUNT.size} + {_TENSOR.size} each)")
    tensors = []
    for i in range(count):
        *shape, elem_size, offset, region = _TENSOR.unpack_from(data, _COUNT.size + i * _TENSOR.size)
        tensor = VelaTensor(tuple(shape), elem_size, offset, region)
        _check_elem_size(tensor, f"{kind}[{i}]")
        tensors.append(tensor)
    return tensors


def parse_payload(blob: bytes) -> EthosUPayload:
    """Read a delegate blob back, strictly: any deviation from the format is an error."""
    blob = bytes(blob)
    blocks = _split_blocks(blob)
    data = dict(blocks)
    for name in ("vela_bin_stream", "vela_end_stream"):
        if data[name]:
            raise _bad(f"block {name!r} must be empty, has {len(data[name])} bytes")
    if len(data["scratch_size"]) != _U32.size:
        raise _bad(f"scratch_size block is {len(data['scratch_size'])} bytes, expected {_U32.size}")
    return EthosUPayload(
        cmd_data=data["cmd_data"],
        weight_data=data["weight_data"],
        scratch_size=_U32.unpack(data["scratch_size"])[0],
        inputs=_parse_tensors(data["inputs"], "input"),
        outputs=_parse_tensors(data["outputs"], "output"),
        blocks=[(name, len(payload)) for name, payload in blocks],
    )
