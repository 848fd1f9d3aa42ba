"""The NPU's view of memory: regions mapped the way ExecuTorch's Ethos-U delegate maps them on a device, with
every access checked against its region and every read of a byte nothing wrote refused.

Region indices are the base-pointer slots the firmware fills: 0 the constant data (``weight_data``, read
only: flash on a device), 1 the scratch arena (the delegate's inputs and outputs live inside it), 2 the fast
scratch (the SRAM cache of the Dedicated_Sram memory mode). A payload does not state the fast scratch's size (the
platform lends it), so that region grows to what the stream addresses, within a memory limit, and reports it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import CORRUPT_STREAM_HINT, RAISE_MEMORY_HINT, TosakitError

REGION_NAMES = {0: "weights", 1: "scratch", 2: "fast scratch"}
GRID_CHECKED = 1 << 22  # feature maps up to this many elements are checked address by address


class NpuAccessError(TosakitError):
    """A command reads or writes outside a region, or reads bytes nothing wrote."""


@dataclass
class Region:
    """One base-pointer region: its bytes and which of them hold a written value."""

    index: int
    data: np.ndarray  # uint8
    written: np.ndarray  # bool, one per byte
    writable: bool = True
    limit: int = 0  # a growing region's largest size (0: a fixed region)
    used: int = 0  # a growing region: the end of the highest span a command addressed

    @classmethod
    def of(cls, index: int, size: int, content: bytes | None = None, writable: bool = True) -> "Region":
        data = np.zeros(size, np.uint8)
        written = np.zeros(size, bool)
        if content is not None:
            data[: len(content)] = np.frombuffer(content, np.uint8)
            written[: len(content)] = True
        return cls(index, data, written, writable)

    @classmethod
    def growing(cls, index: int, limit: int) -> "Region":
        """A region the platform sizes to what the stream addresses, up to ``limit`` bytes."""
        return cls(index, np.zeros(0, np.uint8), np.zeros(0, bool), True, limit)

    def reach(self, hi: int) -> bool:
        """Whether bytes up to ``hi`` lie in the region (a growing one grows to hold them, within its limit)."""
        if hi <= self.data.size or not self.limit:
            return hi <= self.data.size
        if hi > self.limit:
            return False
        self.used = max(self.used, hi)
        size = min(self.limit, max(hi, 2 * self.data.size))  # doubling: a stream of growing spans stays linear
        self.data = np.concatenate([self.data, np.zeros(size - self.data.size, np.uint8)])
        self.written = np.concatenate([self.written, np.zeros(size - self.written.size, bool)])
        return True

    @property
    def capacity(self) -> int:
        return max(self.data.size, self.limit)

    @property
    def name(self) -> str:
        return f"region {self.index} ({REGION_NAMES.get(self.index, 'unmapped')})"


class Memory:
    """The regions a command stream addresses; ``where`` names the command for error messages."""

    def __init__(self, regions: list[Region]):
        self.regions = {r.index: r for r in regions}
        self.where = "before the first command"
        self.moved: dict[tuple[int, str], int] = {}  # (region, "read" | "write") -> bytes moved so far

    def _count(self, index: int, way: str, nbytes: int) -> None:
        self.moved[index, way] = self.moved.get((index, way), 0) + nbytes

    def moved_since(self, mark: dict[tuple[int, str], int]) -> dict[tuple[int, str], int]:
        """Bytes read and written per region since ``mark`` (an earlier copy of ``moved``)."""
        return {k: v - mark.get(k, 0) for k, v in self.moved.items() if v != mark.get(k, 0)}

    def region(self, index: int) -> Region:
        if index not in self.regions:
            raise NpuAccessError(f"{self.where} addresses region {index}, which the delegate does not map",
                                 f"mapped regions: {', '.join(r.name for r in self.regions.values())}")
        return self.regions[index]

    def _check(self, region: Region, addresses: np.ndarray, nbytes: int, verb: str) -> None:
        if addresses.size:
            self.check_span(region.index, int(addresses.min()), int(addresses.max()) + nbytes, verb)

    def check_span(self, index: int, lo: int, hi: int, verb: str) -> None:
        """Bytes [lo, hi) of region ``index`` must lie inside it (checked before any address array is made)."""
        region = self.region(index)
        if region.limit and lo >= 0 and hi <= region.data.size:
            region.used = max(region.used, hi)
        if region.limit and lo >= 0 and hi > region.limit:
            raise NpuAccessError(
                f"{self.where} {verb} bytes [{lo:#x}, {hi:#x}) of {region.name}, more than the {region.limit}-byte "
                "memory limit leaves for it", RAISE_MEMORY_HINT)
        if lo < 0 or not region.reach(hi):
            raise NpuAccessError(
                f"{self.where} {verb} bytes [{lo:#x}, {hi:#x}) of {region.name}, which holds {region.data.size:#x} bytes",
                "on a device this command would touch memory outside what Vela planned for the delegate: do not "
                "deploy this program; `--engine tosa` runs its TOSA instead (and please report the model)")

    def check_extent(self, index: int, shape: tuple[int, ...], elem: int, verb: str) -> None:
        """A feature map of ``shape`` (``elem``-byte elements, each at its own address) too large for region
        ``index`` is refused before its address grid is made, when that grid would be large (a smaller one is
        made and checked address by address, which names the bytes)."""
        region, count = self.region(index), int(np.prod(shape, dtype=object))
        if count > GRID_CHECKED and count * elem > region.capacity:
            raise NpuAccessError(
                f"{self.where} {verb} a {'x'.join(map(str, shape))} feature map ({count * elem:#x} bytes), more than "
                f"{region.name} holds ({region.data.size:#x} bytes)",
                "the command stream is corrupt: do not deploy this program; `--engine tosa` runs its TOSA instead")

    def read_bytes(self, index: int, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` of region ``index``."""
        self.check_span(index, start, start + length, "reads")
        return self.read(index, start + np.arange(length), np.uint8).astype(np.uint8).tobytes()

    def read(self, index: int, addresses: np.ndarray, dtype: np.dtype) -> np.ndarray:
        """The ``dtype`` values at byte ``addresses`` (any shape) of region ``index``."""
        region, dtype = self.region(index), np.dtype(dtype)
        self._check(region, addresses, dtype.itemsize, "reads")
        spans = addresses[..., None] + np.arange(dtype.itemsize)
        if not region.written[spans].all():
            first = int(spans[~region.written[spans]].min())
            raise NpuAccessError(
                f"{self.where} reads byte {first:#x} of {region.name}, which no earlier command or input wrote",
                "the scratch layout is wrong (an area read before it is written): report the program to tosakit")
        self._count(index, "read", spans.size)
        return region.data[spans].view(dtype).reshape(addresses.shape).astype(np.int64)

    def write(self, index: int, addresses: np.ndarray, values: np.ndarray, dtype: np.dtype) -> None:
        """Store ``values`` (already in range) as ``dtype`` at byte ``addresses`` of region ``index``."""
        region, dtype = self.region(index), np.dtype(dtype)
        if not region.writable:
            raise NpuAccessError(f"{self.where} writes to {region.name}, which is read only",
                                 CORRUPT_STREAM_HINT)
        self._check(region, addresses, dtype.itemsize, "writes")
        spans = (addresses[..., None] + np.arange(dtype.itemsize)).reshape(-1)
        region.data[spans] = np.ascontiguousarray(values.astype(dtype).reshape(-1)).view(np.uint8)
        region.written[spans] = True
        self._count(index, "write", spans.size)

    def copy(self, src: int, src_start: int, dst: int, dst_start: int, length: int) -> None:
        """A linear byte copy (DMA)."""
        self.check_span(src, src_start, src_start + length, "reads")
        self.check_span(dst, dst_start, dst_start + length, "writes")
        self.write(dst, dst_start + np.arange(length), self.read(src, src_start + np.arange(length), np.uint8),
                   np.uint8)
