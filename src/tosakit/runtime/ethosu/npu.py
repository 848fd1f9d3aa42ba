"""The NPU executing its command stream: registers hold what the stream set, each operation reads them through
the helpers here (its operands, kernel, activation, output), one numpy-vectorised executor per operation family
(``executors``: convolution, pooling, elementwise, DMA) registered with what each runs of Ethos-U85 streams."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from ...errors import CORRUPT_STREAM_HINT, RUN_TOSA_HINT, TosakitError
from ...targets import ETHOSU_TARGETS
from . import numerics
from .commands import Command, NotSimulatedError
from .featuremap import FeatureMap, Registers
from .memory import Memory
from .registers import U55_LUTS, U85_LUTS, Field, Lut
from .weights import decode_scales

# SHRAM's last 2 KiB hold the LUTs, in slots of 256 bytes (TABLE_0..TABLE_7).
LUT_BYTES, LUT_SLOT_BYTES = 2048, 256
# Work a single operation may do (multiply-accumulates or elements touched): bounds a hostile stream's time.
MAX_OP_WORK = 1 << 33
# Elements of an operation's temporaries computed at once (OFM pixels x their window): bounds its memory.
CHUNK = 1 << 22

OPERATIONS: dict[str, Callable[["Npu", Command], None]] = {}
# What the simulator runs of Ethos-U85 streams, declared beside what reads it (``operation`` for an operation's own
# fields, ``u85_runs`` for the registers operations share): (command, field) -> the values (enum names) it runs. A
# stream setting any other, or holding an operation no executor runs, is refused before it runs
# (``require_simulated``), so its delegate runs its TOSA.
U85_RUNS: dict[tuple[str, str], frozenset] = {}


def operation(name: str, **u85: Iterable):
    """Register the executor of command ``name``, with the values of its fields it runs on Ethos-U85 (``u85``:
    field -> values; a field not named runs every value)."""
    def register(fn):
        OPERATIONS[name] = fn
        U85_RUNS.update({(name, f): frozenset(values) for f, values in u85.items()})
        return fn
    return register


def u85_runs(register: str, field: str, values: Iterable) -> None:
    """Declare the values of ``register``'s ``field`` the simulator runs in Ethos-U85 streams."""
    U85_RUNS[register, field] = frozenset(values)


class UnsupportedCommandError(NotSimulatedError):
    """A command the simulator does not execute (yet)."""


# Npu.activation: on Ethos-U85 no LUT, or the LUT functions U85_LUTS names; Npu.read: an IFM in memory or chained.
u85_runs("NPU_SET_ACTIVATION", "activation_function", {"ACTIVATION_FUNCTION_LUT_NONE", *U85_LUTS})
for _fm in ("IFM", "IFM2"):
    u85_runs(f"NPU_SET_{_fm}_PRECISION", "activation_storage",
             {f"ACTIVATION_STORAGE_{m}" for m in ("TILE2X2", "CHAINED", "NONE")})


class Npu:
    """One NPU: its registers, the memory it addresses, and the accelerator it is (cores, MACs)."""

    def __init__(self, register_map: dict, memory: Memory, accelerator: str, shram_bytes: int):
        self.regs = Registers(register_map)
        self.memory = memory
        self.accelerator = accelerator
        self.u85 = ETHOSU_TARGETS[accelerator].family == "u85"
        # Internal memory DMA fills LUT slots of: SHRAM's last 2 KiB on U55/U65, the 2 KiB LUT RAM on U85.
        self.shram = np.zeros(max(shram_bytes, LUT_BYTES), np.uint8)
        self.lut_written = np.zeros(LUT_BYTES, bool)
        self.chains: dict[int, np.ndarray] = {}  # U85 chain buffers: an OFM kept inside for the next operation
        self.executed: list[tuple[int, str]] = []  # (command offset, operation) of every operation run
        self.moved: dict[tuple[int, str], int] = {}  # the last operation's bytes read and written, per region
        self.weights: np.ndarray | None = None  # the last weighted operation's weights, decoded
        self.deadline: float | None = None

    def run(self, commands, deadline: float | None = None, observe=None) -> None:
        """Execute ``commands`` in order; past ``deadline`` (``time.monotonic()``) stop with an error. Every
        error an operation raises names its command's offset; ``observe(npu, command)`` follows each operation."""
        self.deadline = deadline
        for command in commands:
            name = command.register.name
            self.memory.where = f"command at offset {command.offset:#x} ({name})"
            run = OPERATIONS.get(name)
            if run is None:
                self.regs.set(command)
                continue
            self.check_deadline()
            mark = dict(self.memory.moved)
            try:
                run(self, command)
            except TosakitError as exc:
                if exc.message.startswith(self.memory.where):
                    raise
                raise type(exc)(f"{self.memory.where}: {exc.message}", exc.hint) from None
            except MemoryError:
                raise TosakitError(f"{self.memory.where} needs more memory than the simulator may use",
                                   "the command stream is corrupt, or raise the limit (--max-memory)") from None
            self.moved = self.memory.moved_since(mark)
            self.executed.append((command.offset, name))
            if observe is not None:
                observe(self, command)

    def check_deadline(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise TosakitError(f"the Ethos-U simulation ran past its time limit, at the {self.memory.where}",
                               "raise the time limit (--timeout SECONDS) or run a smaller program")

    # ------------------------------------------------------------------ register views

    def value(self, register: str, field: str) -> int:
        return self.regs.value(f"NPU_SET_{register}", field)

    def name(self, register: str, field: str) -> str:
        return self.regs.name(f"NPU_SET_{register}", field)

    def ofm_shape(self) -> tuple[int, int, int]:
        """The OFM an operation computes, refused before anything is computed when it could not fit where it goes
        (its region; a chain buffer, no larger than the largest region could grow)."""
        shape = (self.value("OFM_HEIGHT_M1", "height_m1") + 1, self.value("OFM_WIDTH_M1", "width_m1") + 1,
                 self.value("OFM_DEPTH_M1", "depth_m1") + 1)
        ofm = FeatureMap.of(self.regs, "OFM")
        if not self.ofm_chained():
            self.memory.check_extent(ofm.region, shape, ofm.elem, "writes")
        elif shape[0] * shape[1] * shape[2] * ofm.elem > max(r.capacity for r in self.memory.regions.values()):
            raise TosakitError(f"{self.memory.where} chains a {'x'.join(map(str, shape))} OFM, larger than any memory "
                               "region", CORRUPT_STREAM_HINT)
        return shape

    def ofm_chained(self) -> bool:
        """Whether the operation keeps its OFM in a chain buffer for the next one (Ethos-U85), not in memory."""
        return self.u85 and self.name("OFM_PRECISION", "activation_storage").endswith("CHAINED")

    def stored_ofm(self) -> np.ndarray:
        """The OFM the last operation stored, as it stored it: in memory (on U85 in its transposed axis order), or
        the chain buffer it left for the next operation."""
        ofm, shape = FeatureMap.of(self.regs, "OFM"), self.ofm_shape()
        if not self.u85:
            return ofm.read(self.memory, *shape)
        if self.ofm_chained():
            return self.chains[ofm.region]
        order = TRANSPOSES[self.name("OFM_PRECISION", "activation_transpose").rsplit("_", 1)[1]]
        return ofm.read(self.memory, *(shape[a] for a in order))

    def kernel(self) -> "Kernel":
        stride = lambda axis: ((self.value("KERNEL_STRIDE", f"stride_{axis}_msb") << 1)  # noqa: E731
                               | self.value("KERNEL_STRIDE", f"stride_{axis}_lsb")) + 1
        dilation = lambda axis: 2 if self.name("KERNEL_STRIDE", f"dilation_{axis}").endswith("X2") else 1  # noqa: E731
        dy, dx = dilation("y"), dilation("x")
        # The kernel size registers hold the dilated extent.
        return Kernel(self.value("KERNEL_HEIGHT_M1", "height_m1") // dy + 1,
                      self.value("KERNEL_WIDTH_M1", "width_m1") // dx + 1, stride("y"), stride("x"), dy, dx,
                      tuple(self.value(f"IFM_PAD_{side}", "pad") for side in ("TOP", "LEFT", "BOTTOM", "RIGHT")))

    def bytes_at(self, region_register: str, base_register: str, length_register: str) -> bytes:
        region = self.value(region_register, "region")
        base, length = self.value(base_register, "addr"), self.value(length_register, "length")
        return self.memory.read_bytes(region, base, length)

    def round_mode(self) -> str:
        """The OFM scaling's rounding, by the U55's names (``numerics.scale_output``): U85 states it in OFM_SCALE."""
        if not self.u85:
            return self.name("OFM_PRECISION", "round_mode")
        return U85_ROUNDING[self.name("OFM_SCALE", "round_mode")]

    def clamp(self, values: np.ndarray, ofm: FeatureMap) -> np.ndarray:
        """The activation's clip to [ACTIVATION_MIN, ACTIVATION_MAX] (on U85 only when its clip range is
        B16), then the OFM precision's range."""
        lo, hi = ofm.limits
        clip = self.name("ACTIVATION", "activation_clip_range").endswith("B16") if self.u85 else ofm.bits <= 16
        if clip:
            lo = max(lo, self.regs.signed("NPU_SET_ACTIVATION_MIN", "clip_boundary"))
            hi = min(hi, self.regs.signed("NPU_SET_ACTIVATION_MAX", "clip_boundary"))
        return np.clip(values, lo, hi)

    def activation(self, values: np.ndarray, ofm: FeatureMap) -> np.ndarray:
        """The activation function (RELU is the plain clip; a LUT function looks values up in the LUT memory), then
        the clip."""
        function = self.name("ACTIVATION", "activation_function")
        if function in U85_LUTS:  # U85: clip (the LUT's input range), look up, store
            slot = self.value("ACTIVATION", "table")
            return np.clip(self.lut(U85_LUTS[function], slot, self.clamp(values, ofm)), *ofm.limits)
        if function == "ACTIVATION_FUNCTION_LUT_NONE":
            pass
        elif function.startswith("ACTIVATION_FUNCTION_TABLE_"):  # U55/U65: TABLE_k reads slot k
            values = self.lut(self.u55_lut(ofm), int(function.rsplit("_", 1)[1]), values)
        elif function != "ACTIVATION_FUNCTION_RELU":
            raise UnsupportedCommandError(f"{self.memory.where}: activation {function} is not simulated yet",
                                          RUN_TOSA_HINT)
        return self.clamp(values, ofm)

    def u55_lut(self, ofm: FeatureMap) -> Lut:
        """The LUT an Ethos-U55/U65 TABLE activation reads: 8-bit for an int8 OFM (or a clip range forcing int8),
        16-bit for an int16 one."""
        bits = 8 if self.name("ACTIVATION", "activation_clip_range").endswith("FORCE_INT8") else ofm.bits
        if bits not in U55_LUTS:
            raise UnsupportedCommandError(f"{self.memory.where}: a LUT activation on a {bits}-bit OFM is not "
                                          "simulated yet", RUN_TOSA_HINT)
        return U55_LUTS[bits]

    def lut(self, table: Lut, slot: int, values: np.ndarray) -> np.ndarray:
        """``values`` (saturated to the table's input range) looked up in the ``table`` starting at LUT slot
        ``slot``, interpolated when its entries hold a base and a slope."""
        at = slot * LUT_SLOT_BYTES
        if at + table.size > LUT_BYTES:
            raise TosakitError(f"{self.memory.where}: a {table.bits}-bit LUT at slot {slot} lies outside the LUT "
                               "memory", "the command stream is corrupt")
        if not self.lut_written[at: at + table.size].all():
            raise TosakitError(f"{self.memory.where} reads LUT slot {slot}, which no DMA filled",
                               CORRUPT_STREAM_HINT)
        start = self.shram.size - LUT_BYTES + at
        raw = self.shram[start: start + table.size].view(f"<u{table.entry_bytes}").astype(np.int64)
        entries = {f.name: _field_values(raw, f) for f in table.fields}
        lo = -1 << (table.bits - 1)
        steps = np.clip(values, lo, -lo - 1) - lo
        index, fraction = steps >> table.fraction_bits, steps & ((1 << table.fraction_bits) - 1)
        if not table.fraction_bits:
            return entries["value"][index]
        half = 1 << (table.fraction_bits - 1)
        return entries["base"][index] + ((entries["slope"][index] * fraction + half) >> table.fraction_bits)

    def read(self, fm: FeatureMap, h: int, w: int, c: int) -> np.ndarray:
        """An operand's [h, w, c] integers: from memory, or (U85) from the chain buffer an operation left."""
        if not self.u85 or not self.name(f"{fm.prefix}_PRECISION", "activation_storage").endswith("CHAINED"):
            return fm.read(self.memory, h, w, c)
        found = self.chains.get(fm.region)
        if found is None:
            raise TosakitError(f"{self.memory.where} reads chain buffer {fm.region}, which no earlier operation wrote",
                               CORRUPT_STREAM_HINT)
        if found.size != h * w * c:
            raise TosakitError(f"{self.memory.where} reads {h}x{w}x{c} values from chain buffer {fm.region}, which "
                               f"holds {'x'.join(map(str, found.shape))}", "the command stream is corrupt")
        return found.reshape(h, w, c)

@dataclass(frozen=True)
class Kernel:
    """The kernel an operation slides over the IFM: size, stride, dilation and padding."""

    h: int
    w: int
    sy: int
    sx: int
    dy: int
    dx: int
    pad: tuple[int, int, int, int]  # top, left, bottom, right

    def ifm_extent(self, oh: int, ow: int) -> tuple[int, int]:
        """The IFM height and width the NPU reads for an OFM of oh x ow (the padding is outside it)."""
        top, left, bottom, right = self.pad
        return ((oh - 1) * self.sy + (self.h - 1) * self.dy + 1 - top - bottom,
                (ow - 1) * self.sx + (self.w - 1) * self.dx + 1 - left - right)


def _field_values(words: np.ndarray, field: Field) -> np.ndarray:
    """A field of each word, sign-extended when the field is signed."""
    values = (words >> field.lsb) & ((1 << field.width) - 1)
    return values - ((values >> (field.width - 1)) << field.width) if field.signed else values


def check_work(amount: int, what: str) -> None:
    if amount > MAX_OP_WORK:
        raise TosakitError(f"{what} would take {amount:,} steps, more than the simulator's bound of {MAX_OP_WORK:,}",
                           "the command stream is corrupt or the model is far larger than an Ethos-U runs")


def windows(npu: Npu, depth: int) -> tuple[np.ndarray, np.ndarray, FeatureMap, Kernel]:
    """The IFM (zero point taken off, upscaled as IFM_UPSCALE says) as [OH, OW, depth, KH, KW] windows, and
    a mask of the positions inside the IFM (False in the padding, which holds zeros)."""
    oh, ow, _ = npu.ofm_shape()
    k = npu.kernel()
    ifm = FeatureMap.of(npu.regs, "IFM")
    ih, iw = k.ifm_extent(oh, ow)
    if ih <= 0 or iw <= 0:
        raise TosakitError(f"{npu.memory.where}: padding {k.pad} leaves no IFM to read for an OFM of {oh}x{ow}",
                           CORRUPT_STREAM_HINT)
    check_work(oh * ow * depth * k.h * k.w, npu.memory.where)
    upscale = npu.name("IFM_UPSCALE", "mode")
    if upscale == "IFM_UPSCALE_MODE_NONE":
        x = npu.read(ifm, ih, iw, depth) - ifm.zero_point
    else:  # 2x in height and width: each value repeated (NEAREST) or followed by zeros (ZEROS)
        x = npu.read(ifm, -(-ih // 2), -(-iw // 2), depth) - ifm.zero_point
        if upscale == "IFM_UPSCALE_MODE_NEAREST":
            x = x.repeat(2, axis=0).repeat(2, axis=1)[:ih, :iw]
        else:
            up = np.zeros((2 * x.shape[0], 2 * x.shape[1], depth), np.int64)
            up[::2, ::2] = x
            x = up[:ih, :iw]
    top, left, bottom, right = k.pad
    padded = np.pad(x, ((top, bottom), (left, right), (0, 0)))
    inside = np.pad(np.ones((ih, iw), bool), ((top, bottom), (left, right)))
    view = np.lib.stride_tricks.sliding_window_view
    eh, ew = (k.h - 1) * k.dy + 1, (k.w - 1) * k.dx + 1
    win = view(padded, (eh, ew), axis=(0, 1))[: (oh - 1) * k.sy + 1: k.sy, : (ow - 1) * k.sx + 1: k.sx, :, :: k.dy, :: k.dx]
    mask = view(inside, (eh, ew))[: (oh - 1) * k.sy + 1: k.sy, : (ow - 1) * k.sx + 1: k.sx, :: k.dy, :: k.dx]
    return win, mask, ifm, k


def by_blocks(npu: Npu, oh: int, ow: int, per_pixel: int, compute) -> np.ndarray:
    """``compute(rows, columns)`` (slices of the OFM) over blocks of at most CHUNK elements of work (one pixel
    at least), joined into the [oh, ow, ...] result: an operation's temporaries stay small."""
    rows = max(1, CHUNK // max(per_pixel * ow, 1))
    cols = ow if rows > 1 else max(1, min(ow, CHUNK // max(per_pixel, 1)))
    out = []
    for y in range(0, oh, rows):
        line = []
        for x in range(0, ow, cols):
            npu.check_deadline()
            line.append(compute(slice(y, y + rows), slice(x, x + cols)))
        out.append(np.concatenate(line, axis=1))
    return np.concatenate(out, axis=0)


def exact_dot(a: np.ndarray, b: np.ndarray, axes) -> np.ndarray:
    """Integer tensordot, through float64 BLAS when every partial sum is exact in it (below 2**53)."""
    terms = int(np.prod([a.shape[i] for i in axes[0]]))
    bound = terms * int(np.abs(a).max(initial=0)) * int(np.abs(b).max(initial=0))
    if bound < 1 << 53:
        return np.rint(np.tensordot(a.astype(np.float64), b.astype(np.float64), axes)).astype(np.int64)
    return np.tensordot(a.astype(object), b.astype(object), axes).astype(np.int64)


def _output(npu: Npu, acc: np.ndarray, scale, shift) -> None:
    ofm = FeatureMap.of(npu.regs, "OFM")
    out = numerics.scale_output(acc, scale, shift, npu.round_mode()) + ofm.zero_point
    write_ofm(npu, ofm, npu.activation(out, ofm))


# U85's OFM transposes: the axes of the computed [H, W, C] OFM in the order they are stored.
TRANSPOSES = {"HWC": (0, 1, 2), "WHC": (1, 0, 2), "HCW": (0, 2, 1), "WCH": (1, 2, 0), "CHW": (2, 0, 1),
              "CWH": (2, 1, 0)}
# U85's OFM rounding modes by the U55 names numerics.scale_output takes (the ones Vela writes for TOSA).
U85_ROUNDING = {"ROUND_MODE_OFM_NATURAL": "ROUND_MODE_NATURAL", "ROUND_MODE_OFM_DOUBLE_SYMMETRIC": "ROUND_MODE_DBL",
                "ROUND_MODE_OFM_TRUNCATE_TO_ZERO": "ROUND_MODE_TRUNCATE"}
u85_runs("NPU_SET_OFM_SCALE", "round_mode", U85_ROUNDING)  # Npu.round_mode
u85_runs("NPU_SET_OFM_SCALE", "dbl_rnd", {0})


u85_runs("NPU_SET_OFM_PRECISION", "activation_storage", {"ACTIVATION_STORAGE_TILE2X2", "ACTIVATION_STORAGE_CHAINED"})


def write_ofm(npu: Npu, ofm: FeatureMap, values: np.ndarray) -> None:
    """Store the computed OFM: on U85 reversed or transposed as OFM_PRECISION says (its tile registers describe the
    stored shape), or kept in a chain buffer."""
    if npu.ofm_chained():
        npu.chains[ofm.region] = values  # chaining and transposing never meet (regor asserts it)
        return
    if npu.u85:
        reverse = npu.name("OFM_PRECISION", "activation_reverse").removeprefix("ACTIVATION_REVERSE_")
        if reverse != "NONE":  # the computed OFM reversed along one axis (never with a transpose: regor asserts it)
            values = np.flip(values, "HWC".index(reverse))
        values = values.transpose(TRANSPOSES[npu.name("OFM_PRECISION", "activation_transpose").rsplit("_", 1)[1]])
    ofm.write(npu.memory, values)


def _scales(npu: Npu, depth: int):
    record = "u55"
    if npu.u85:
        record = "u85_acc48" if npu.name("ACC_FORMAT", "acc_format").endswith("I48") else "u85_acc32"
    record = decode_scales(npu.bytes_at("SCALE_REGION", "SCALE_BASE", "SCALE_LENGTH"), depth, record)
    return record.bias, record.scale, record.shift


u85_runs("NPU_SET_ACC_FORMAT", "acc_input", {"ACC_INPUT_RESET", "ACC_INPUT_IFM2"})
u85_runs("NPU_SET_ACC_FORMAT", "acc_output", {"ACC_OUTPUT_ENABLE"})


def finish(npu: Npu, acc: np.ndarray, scale_stream: bool) -> None:
    """The accumulators to the OFM: on U85 first added to what ACC_FORMAT loads them from (IFM2's values); then the
    bias and per-channel scales of the scale stream (on U85 when the OFM scale mode is per channel), or OFM_SCALE."""
    if npu.u85:
        if npu.name("ACC_FORMAT", "acc_input") == "ACC_INPUT_IFM2":
            ifm2 = FeatureMap.of(npu.regs, "IFM2")
            acc = acc + (npu.read(ifm2, *acc.shape) - ifm2.zero_point)
        scale_stream = npu.name("OFM_PRECISION", "scale_mode") == "OFM_SCALE_MODE_PER_CHANNEL"
    if scale_stream:
        bias, scale, shift = _scales(npu, acc.shape[-1])
        acc = acc + bias
    else:
        scale, shift = npu.value("OFM_SCALE", "scale"), npu.value("OFM_SCALE", "shift")
    _output(npu, acc, scale, shift)


def weight_streams(commands, register_map: dict, constant: bytes, budget: int) -> list[bytes]:
    """The weight streams the convolutions of ``commands`` will read, in order, found from the registers alone
    (no data flows into them): read from the constant region, or from where a DMA copied them from it. A guess
    that only speeds a run up (the codec decodes them ahead): at most ``budget`` bytes, each stream once."""
    regs, copies, found, total = Registers(register_map), deque(maxlen=64), {}, 0  # recent copies only
    value = lambda register, field: regs.value(f"NPU_SET_{register}", field)  # noqa: E731
    formats = "NPU_SET_WEIGHT_FORMAT" in regs.by_name  # U85: a stream may be in its fast-decode format
    for command in commands:
        name = command.register.name
        if name == "NPU_OP_DMA_START":
            copies.append((value("DMA0_DST_REGION", "region"), value("DMA0_DST", "addr"),
                           value("DMA0_LEN", "addr"), value("DMA0_SRC_REGION", "region"), value("DMA0_SRC", "addr")))
        elif name in ("NPU_OP_CONV", "NPU_OP_DEPTHWISE") and not (formats and value("WEIGHT_FORMAT", "weight_format")):
            # (a U85 fast-decode stream is not Vela's codec's to decode)
            region, start = value("WEIGHT_REGION", "region"), value("WEIGHT_BASE", "addr")
            length = value("WEIGHT_LENGTH", "length")
            for dst_region, dst, size, src_region, src in reversed(copies):  # the last copy there wins
                if dst_region == region and dst <= start and start + length <= dst + size:
                    region, start = src_region, src + start - dst
                    break
            if region == 0 and start + length <= len(constant) and (start, length) not in found:
                total += length
                if total > budget:
                    break
                found[start, length] = constant[start: start + length]
        elif name not in OPERATIONS:
            regs.set(command)
    return list(found.values())


for _wait in ("NPU_OP_DMA_WAIT", "NPU_OP_KERNEL_WAIT", "NPU_OP_PMU_MASK", "NPU_OP_IRQ", "NPU_OP_STOP"):
    # Operations complete in order on the host: waits, interrupts and performance counters change no data.
    operation(_wait)(lambda npu, command: None)
