"""Feature maps as the NPU addresses them: four tiles, NHWC or NHCWB16 (bricks of 16 channels), strides and
zero points, all read from the registers a command stream has set."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .memory import Memory
from .registers import Field

BRICK = 16
_BITS = {"ACTIVATION_PRECISION_B8": 8, "ACTIVATION_PRECISION_B16": 16, "ACTIVATION_PRECISION_B32": 32,
         "ACTIVATION_PRECISION_B64": 64}


class Registers:
    """The value each register holds: the last command that set it, or the reset value 0. A register or field
    this NPU does not have is a KeyError naming it (a misspelt name never reads as 0)."""

    def __init__(self, register_map: dict):
        self.by_name = {r.name: r for r in register_map.values()}
        self.fields = {(r.name, f.name): f for r in register_map.values() for f in r.fields}
        self.commands: dict = {}

    def set(self, command) -> None:
        self.commands[command.register.name] = command

    def field(self, register: str, field: str) -> Field:
        """Field ``field`` of ``register``."""
        found = self.fields.get((register, field))
        if found is None:
            if register not in self.by_name:
                raise KeyError(f"this NPU has no register {register!r}")
            known = ", ".join(f.name for f in self.by_name[register].fields) or "none"
            raise KeyError(f"{register} has no field {field!r} (fields: {known})")
        return found

    def value(self, register: str, field: str) -> int:
        self.field(register, field)
        command = self.commands.get(register)
        return 0 if command is None else command.field(field)

    def signed(self, register: str, field: str, bits: int = 16) -> int:
        v = self.value(register, field)
        return v - (1 << bits) if v >= 1 << (bits - 1) else v

    def name(self, register: str, field: str) -> str:
        """A field's enum name."""
        f = self.field(register, field)
        return f.enum.get(self.value(register, field), "") if f.enum else ""


@dataclass(frozen=True)
class FeatureMap:
    """One operand (IFM, IFM2 or OFM) of an NPU operation."""

    prefix: str
    region: int
    bases: tuple[int, int, int, int]
    height0: int
    height1: int
    width0: int
    stride_x: int
    stride_y: int
    stride_c: int
    bits: int
    signed: bool
    brick: bool  # NHCWB16
    zero_point: int

    @classmethod
    def of(cls, regs: Registers, prefix: str) -> "FeatureMap":
        r = f"NPU_SET_{prefix}_"
        precision = r + "PRECISION"
        bits = _BITS.get(regs.name(precision, "activation_precision"), 8)
        signed = regs.name(precision, "activation_type") == "ACTIVATION_TYPE_SIGNED"
        zp = regs.value(r + "ZERO_POINT", "zero_point")
        if signed or bits > 8:
            zp = zp - (1 << 16) if zp >= 1 << 15 else zp
        return cls(
            prefix, regs.value(r + "REGION", "region"),
            tuple(regs.value(f"{r}BASE{i}", "addr") for i in range(4)),
            regs.value(r + "HEIGHT0_M1", "height_m1") + 1, regs.value(r + "HEIGHT1_M1", "height_m1") + 1,
            regs.value(r + "WIDTH0_M1", "width_m1") + 1,
            *(regs.signed(r + f"STRIDE_{axis}", "addr", 40) for axis in "XYC"),  # negative: a reversed axis
            bits, signed, regs.name(precision, "activation_format") == "ACTIVATION_FORMAT_NHCWB16", zp)

    @property
    def elem(self) -> int:
        return self.bits // 8

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(f"{'i' if self.signed else 'u'}{self.elem}")

    @property
    def limits(self) -> tuple[int, int]:
        return (-(1 << (self.bits - 1)), (1 << (self.bits - 1)) - 1) if self.signed else (0, (1 << self.bits) - 1)

    def addresses(self, y: np.ndarray, x: np.ndarray, c: np.ndarray) -> np.ndarray:
        """Byte addresses of elements (y, x, c) (broadcast together), through the four tiles."""
        if np.max(y, initial=0) < self.height0 and np.max(x, initial=0) < self.width0:
            return self._tile_offsets(self.bases[0], y, x, c)  # all in tile 0: separable, no per-element work
        y, x, c = np.broadcast_arrays(np.asarray(y, np.int64), np.asarray(x, np.int64), np.asarray(c, np.int64))
        right = x >= self.width0
        lower = np.where(right, y >= self.height1, y >= self.height0)
        tile = right.astype(np.int64) + 2 * lower
        y = y - np.where(lower, np.where(right, self.height1, self.height0), 0)
        x = x - np.where(right, self.width0, 0)
        return self._tile_offsets(np.asarray(self.bases, np.int64)[tile], y, x, c)

    def _tile_offsets(self, base, y, x, c) -> np.ndarray:
        x_step = BRICK * self.elem if self.brick else self.stride_x
        c_offset = (c // BRICK) * self.stride_c + (c % BRICK) * self.elem if self.brick else c * self.elem
        return base + (np.asarray(y, np.int64) * self.stride_y + np.asarray(x, np.int64) * x_step) + c_offset

    def grid(self, h: int, w: int, c: int) -> np.ndarray:
        """Addresses of the whole [h, w, c] map."""
        return self.addresses(np.arange(h)[:, None, None], np.arange(w)[None, :, None], np.arange(c)[None, None, :])

    def read(self, memory: Memory, h: int, w: int, c: int) -> np.ndarray:
        """The [h, w, c] integers stored (int64, without the zero point taken off)."""
        memory.check_extent(self.region, (h, w, c), self.elem, "reads")
        return memory.read(self.region, self.grid(h, w, c), self.dtype)

    def write(self, memory: Memory, values: np.ndarray) -> None:
        memory.check_extent(self.region, values.shape, self.elem, "writes")
        memory.write(self.region, self.grid(*values.shape), values, self.dtype)
