"""The VGF container (the model converter's output, a VgfBackend delegate's payload), checked before Arm's native
stack reads it: the FourCC, a format version this stack reads, a 128-byte header whose four sections (module
table, model sequence table, model resource table, constants) lie inside the file, in that order, without overlap,
each a flatbuffer whose root offset points inside it."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ...errors import TosakitError

MAGIC = b"VGF1"
HEADER_BYTES = 128
SECTIONS = ("module table", "model sequence table", "model resource table", "constant section")
# Layout of the header: FourCC, 4 bytes, format version (major, minor, patch, 1 byte), 4 bytes (the encoder's
# Vulkan headers version), then per section its offset and size (u64 each), then zeros to byte 128.
_VERSION = struct.Struct("<BBBx")
_SECTION = struct.Struct("<QQ")
READ_VERSIONS = {(0, 5)}  # the (major, minor) format versions ai-ml-sdk 0.11 writes and reads
FLATBUFFER_SECTIONS = SECTIONS[:3]  # the constant section holds raw data


@dataclass(frozen=True)
class VgfContainer:
    """A checked VGF file: its format version and each section's (offset, size)."""

    version: tuple[int, int, int]
    sections: dict[str, tuple[int, int]]
    size: int


def parse_vgf(data: bytes, what: str = "the VGF payload") -> VgfContainer:
    """Check ``data`` as a VGF container; a TosakitError naming the fault otherwise."""
    def fail(message: str) -> TosakitError:
        return TosakitError(f"{what}: {message}", "the delegate is damaged or not a VGF file: re-export the model")

    if len(data) < HEADER_BYTES:
        raise fail(f"{len(data)} bytes, shorter than the {HEADER_BYTES}-byte VGF header")
    if data[:4] != MAGIC:
        raise fail(f"starts with {data[:4]!r}, not the VGF FourCC {MAGIC!r}")
    version = _VERSION.unpack_from(data, 8)
    if version[:2] not in READ_VERSIONS:
        raise fail(f"VGF format version {'.'.join(map(str, version))}; this stack reads "
                   f"{', '.join(f'{a}.{b}.x' for a, b in sorted(READ_VERSIONS))}")
    sections, end = {}, HEADER_BYTES
    for k, name in enumerate(SECTIONS):
        offset, size = _SECTION.unpack_from(data, 16 + k * _SECTION.size)
        if offset < end or offset + size > len(data):
            raise fail(f"its {name} spans bytes [{offset}, {offset + size}), outside the file's {len(data)} bytes "
                       f"or over the section before it (which ends at {end})")
        if name in FLATBUFFER_SECTIONS:
            root = struct.unpack_from("<I", data, offset)[0] if size >= 8 else 0
            if size < 8 or not 4 <= root <= size - 4:
                raise fail(f"its {name} ({size} bytes) is not a flatbuffer (root offset {root})")
        sections[name], end = (offset, size), offset + size
    if any(data[16 + len(SECTIONS) * _SECTION.size:HEADER_BYTES]):
        raise fail("its header's reserved bytes are not zero")
    return VgfContainer(version, sections, len(data))
