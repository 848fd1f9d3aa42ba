"""The NPU executing its command stream: registers hold what the stream set, each operation reads them, one
numpy-vectorised executor per operation family (convolution, pooling, elementwise, DMA)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...errors import TosakitError
from ...targets import ETHOSU_TARGETS
from . import numerics
from .commands import NotSimulatedError
from .featuremap import FeatureMap, Registers
from .memory import Memory
from .registers import U55_LUTS, U85_LUTS, Field, Lut
from .weights import U85Layout, decode_scales, decode_weights, decode_weights_u85, weight_streams_u85

# SHRAM's last 2 KiB hold the LUTs, in slots of 256 bytes (TABLE_0..TABLE_7).
LUT_BYTES, LUT_SLOT_BYTES = 2048, 256
# Work a single operation may do (multiply-accumulates or elements touched): bounds a hostile stream's time.
MAX_OP_WORK = 1 << 33
# Elements of an operation's temporaries computed at once (OFM pixels x their window): bounds its memory.
CHUNK = 1 << 22

OPERATIONS: dict[str, Callable[["Npu", object], None]] = {}


def operation(name: str):
    """Register the executor of command ``name``."""
    def register(fn):
        OPERATIONS[name] = fn
        return fn
    return register


class UnsupportedCommandError(NotSimulatedError):
    """A command the simulator does not execute (yet)."""


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
            try:
                run(self, command)
            except TosakitError as exc:
                if exc.message.startswith(self.memory.where):
                    raise
                raise type(exc)(f"{self.memory.where}: {exc.message}", exc.hint) from None
            except MemoryError:
                raise TosakitError(f"{self.memory.where} needs more memory than the simulator may use",
                                   "the command stream is corrupt, or raise the limit (--max-memory)") from None
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
        if not (self.u85 and self.name("OFM_PRECISION", "activation_storage").endswith("CHAINED")):
            self.memory.check_extent(ofm.region, shape, ofm.elem, "writes")
        elif shape[0] * shape[1] * shape[2] * ofm.elem > max(r.capacity for r in self.memory.regions.values()):
            raise TosakitError(f"{self.memory.where} chains a {'x'.join(map(str, shape))} OFM, larger than any memory "
                               "region", "the command stream is corrupt: recompile the program")
        return shape

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
                                          "run the program's TOSA instead (tosakit run --engine tosa)")
        return self.clamp(values, ofm)

    def u55_lut(self, ofm: FeatureMap) -> Lut:
        """The LUT an Ethos-U55/U65 TABLE activation reads: 8-bit for an int8 OFM (or a clip range forcing int8),
        16-bit for an int16 one."""
        bits = 8 if self.name("ACTIVATION", "activation_clip_range").endswith("FORCE_INT8") else ofm.bits
        if bits not in U55_LUTS:
            raise UnsupportedCommandError(f"{self.memory.where}: a LUT activation on a {bits}-bit OFM is not "
                                          "simulated yet", "run the program's TOSA instead (tosakit run --engine tosa)")
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
                               "the command stream is corrupt: recompile the program")
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
                               "the command stream is corrupt: recompile the program")
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
                           "the command stream is corrupt: recompile the program")
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
U85_IFM_ROUNDING = {"ROUND_MODE_IFM_NATURAL": "ROUND_MODE_NATURAL", "ROUND_MODE_IFM_DOUBLE_SYMMETRIC": "ROUND_MODE_DBL"}


def write_ofm(npu: Npu, ofm: FeatureMap, values: np.ndarray) -> None:
    """Store the computed OFM: on U85 reversed or transposed as OFM_PRECISION says (its tile registers describe the
    stored shape), or kept in a chain buffer."""
    if npu.u85 and npu.name("OFM_PRECISION", "activation_storage").endswith("CHAINED"):
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


@operation("NPU_OP_CONV")
def conv(npu: Npu, command) -> None:
    """Convolution (and the vector product: a 1x1 convolution): sum of (ifm - zp) x weight, plus bias, scaled. On
    U85 with ``weights_ifm2`` the matrix product whose weights are IFM2."""
    oh, ow, oc = npu.ofm_shape()
    ic = npu.value("IFM_DEPTH_M1", "depth_m1") + 1
    if npu.u85 and command.field("weights_ifm2"):
        return _matmul(npu, oh, ow, oc, ic)
    w = _weights(npu, npu.kernel(), ic, oc, depthwise=False)
    win, _, ifm, k = windows(npu, ic)
    _finish(npu, by_blocks(npu, oh, ow, ic * k.h * k.w,
                           lambda ys, xs: exact_dot(win[ys, xs], w, ([2, 3, 4], [3, 1, 2]))), scale_stream=True)


def _matmul(npu: Npu, oh: int, ow: int, oc: int, ic: int) -> None:
    """U85 MatMul: OFM[y, x, o] = sum over c of (IFM[y, x, c] - zp) x (IFM2[y, o, c] - zp2); IFM2 holds the right-hand
    matrix transposed (Vela writes it so), a row of it per OFM row; OFM_SCALE, no bias."""
    check_work(oh * ow * oc * ic, npu.memory.where)
    ifm, ifm2 = FeatureMap.of(npu.regs, "IFM"), FeatureMap.of(npu.regs, "IFM2")
    a = npu.read(ifm, oh, ow, ic) - ifm.zero_point
    b = npu.read(ifm2, oh, oc, ic) - ifm2.zero_point
    _finish(npu, np.stack([exact_dot(a[y], b[y], ([1], [1])) for y in range(oh)]), scale_stream=False)


@operation("NPU_OP_DEPTHWISE")
def depthwise(npu: Npu, command) -> None:
    """Depthwise convolution: each channel with its own kernel."""
    oh, ow, oc = npu.ofm_shape()
    w = _weights(npu, npu.kernel(), oc, oc, depthwise=True)[:, :, :, 0]  # [C, KH, KW]
    win, _, ifm, k = windows(npu, oc)
    _finish(npu, np.einsum("hwckl,ckl->hwc", win, w.astype(np.int64)), scale_stream=True)


def _finish(npu: Npu, acc: np.ndarray, scale_stream: bool) -> None:
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


def _weights(npu: Npu, k: Kernel, ic: int, oc: int, depthwise: bool) -> np.ndarray:
    if npu.u85:
        macs = ETHOSU_TARGETS[npu.accelerator].macs
        layout = U85Layout.of(npu.regs, depthwise, macs)
        streams, fwd = weight_streams_u85(npu.regs, npu.memory.read_bytes, layout.cores)
        return decode_weights_u85(streams, layout, fwd, npu.deadline)
    ifm = FeatureMap.of(npu.regs, "IFM")
    return decode_weights(
        npu.bytes_at("WEIGHT_REGION", "WEIGHT_BASE", "WEIGHT_LENGTH"),
        kernel_h=k.h, kernel_w=k.w, ifm_depth=ic, ofm_depth=oc,
        ofm_block_depth=npu.value("OFM_BLK_DEPTH_M1", "depth_m1") + 1, depthwise=depthwise,
        weight_order=npu.name("KERNEL_STRIDE", "weight_order"),
        decomposition=npu.name("KERNEL_STRIDE", "decomposition"),
        dilation=(k.dy, k.dx), ifm_bits=ifm.bits, accelerator=npu.accelerator, deadline=npu.deadline)


@operation("NPU_OP_POOL")
def pool(npu: Npu, command) -> None:
    """Max, min, average and sum pooling over the kernel window (on U85 also none: the accumulators come from IFM2
    alone), then the OFM scale."""
    mode = command.register.fields[0].enum[command.field(command.register.fields[0].name)]
    oh, ow, oc = npu.ofm_shape()
    if mode in ("POOLING_MODE_MAX", "POOLING_MODE_MIN"):
        win, mask, _, k = windows(npu, oc)
        pick, fill = (np.max, np.iinfo(np.int64).min) if mode.endswith("MAX") else (np.min, np.iinfo(np.int64).max)
        acc = by_blocks(npu, oh, ow, oc * k.h * k.w,
                        lambda ys, xs: pick(np.where(mask[ys, xs, None], win[ys, xs], fill), axis=(3, 4)))
    elif mode == "POOLING_MODE_AVERAGE":
        win, mask, _, k = windows(npu, oc)
        acc = win.sum(axis=(3, 4))
        if any(k.pad) or npu.u85:  # the NPU divides by the count of IFM elements in each window itself
            count = mask.sum(axis=(2, 3))[:, :, None]
            acc = numerics.scale_output(acc, *numerics.reciprocal_scale(count), "ROUND_MODE_NATURAL")
        # U55/U65 without padding: OFM_SCALE holds the reciprocal of the kernel area (with any rescale folded in)
    elif mode == "POOLING_MODE_SUM":  # U85: the window's sum (padding holds zeros), then the OFM scale
        win, _, _, k = windows(npu, oc)
        acc = win.sum(axis=(3, 4))
    elif mode == "POOLING_MODE_REDUCE_SUM":  # over the window and every IFM channel, into OFM depth 1
        acc = windows(npu, npu.value("IFM_DEPTH_M1", "depth_m1") + 1)[0].sum(axis=(2, 3, 4))[:, :, None]
    elif mode == "POOLING_MODE_NONE" and npu.u85:  # U85's NullPool: IFM2 (its accumulator source) rescaled
        acc = np.zeros((oh, ow, oc), np.int64)
    else:
        raise UnsupportedCommandError(f"{npu.memory.where}: pooling mode {mode} is not simulated yet",
                                      "run the program's TOSA instead (tosakit run --engine tosa)")
    _finish(npu, acc, scale_stream=False)


@operation("NPU_OP_RESIZE")
def resize(npu: Npu, command) -> None:
    """U85 RESIZE, TOSA's integer rule per axis: output position o reads IFM position (o x d + offset) / n, nearest
    or bilinear (weights in units of 1/n, so the sum is n_y x n_x times the value); the result, times 2**16, through
    OFM_SCALE (whose shift is 16 plus any power-of-two rescale folded in). The kernel size is the IFM's extent."""
    mode = command.register.fields[0].enum[command.field("resize_mode")]
    oh, ow, oc = npu.ofm_shape()
    ih, iw = npu.value("KERNEL_HEIGHT_M1", "height_m1") + 1, npu.value("KERNEL_WIDTH_M1", "width_m1") + 1
    check_work(oh * ow * oc * 4, npu.memory.where)
    ifm = FeatureMap.of(npu.regs, "IFM")
    x = npu.read(ifm, ih, iw, oc) - ifm.zero_point

    def axis(name: str, size: int, extent: int):
        n = npu.value(f"RESIZE_{name}_SCALE_N_M1", f"resize_{name.lower()}_scale_n_m1") + 1
        d = npu.value(f"RESIZE_{name}_STEP", "one_step_int") * n + npu.value(f"RESIZE_{name}_STEP", "one_step_mod")
        offset = npu.regs.signed(f"NPU_SET_RESIZE_{name}_OFFSET", f"resize_{name.lower()}_offset", 12)
        at = np.arange(size, dtype=np.int64) * d + offset
        whole, part = at // n, at % n
        return np.clip(whole, 0, extent - 1), np.clip(whole + 1, 0, extent - 1), part, n

    y0, y1, fy, ny = axis("Y", oh, ih)
    x0, x1, fx, nx = axis("X", ow, iw)
    if mode == "RESIZE_MODE_NEAREST":
        acc = x[np.where(2 * fy >= ny, y1, y0)][:, np.where(2 * fx >= nx, x1, x0)]
    elif mode == "RESIZE_MODE_BILINEAR":
        wy0, wy1 = (ny - fy)[:, None, None], fy[:, None, None]
        wx0, wx1 = (nx - fx)[None, :, None], fx[None, :, None]
        acc = (x[y0][:, x0] * wy0 * wx0 + x[y0][:, x1] * wy0 * wx1 + x[y1][:, x0] * wy1 * wx0
               + x[y1][:, x1] * wy1 * wx1)
    else:
        raise UnsupportedCommandError(f"{npu.memory.where}: resize mode {mode} is not simulated yet",
                                      "run the program's TOSA instead (tosakit run --engine tosa)")
    _finish(npu, acc << 16, scale_stream=False)


@operation("NPU_OP_ELEMENTWISE")
def elementwise(npu: Npu, command) -> None:
    """Binary and unary elementwise operations, with IFM2 broadcast or a scalar operand."""
    mode = command.register.fields[0].enum[command.field(command.register.fields[0].name)]
    h, w, c = npu.ofm_shape()
    check_work(h * w * c, npu.memory.where)
    if npu.u85:
        return _elementwise_u85(npu, mode, h, w, c)
    ifm, ofm = FeatureMap.of(npu.regs, "IFM"), FeatureMap.of(npu.regs, "OFM")
    a, a_zp, b, b_zp = ifm.read(npu.memory, h, w, c), ifm.zero_point, None, 0
    if mode not in numerics.UNARY:
        ifm2 = FeatureMap.of(npu.regs, "IFM2")
        b_zp = ifm2.zero_point
        if npu.name("IFM2_BROADCAST", "broadcast_constant").endswith("ENABLE"):
            scalar = "NPU_SET_IFM2_SCALAR"
            b = np.full((1, 1, 1), npu.regs.signed(scalar, "scalar") if ifm2.signed else npu.regs.value(scalar, "scalar"))
        else:
            shape = [1 if npu.name("IFM2_BROADCAST", f"broadcast_{axis}").endswith("_ENABLE") else n
                     for axis, n in zip("hwc", (h, w, c))]
            b = ifm2.read(npu.memory, *shape)
        if npu.name("IFM2_BROADCAST", "operand_order").endswith("ORDER_A"):  # IFM2 is operand A
            a, a_zp, b, b_zp = b, b_zp, a, a_zp
        a, b = np.broadcast_arrays(a, b)
    out = numerics.elementwise(
        mode, a, b, zero_points=(a_zp, b_zp),
        input_scale=(npu.name("IFM_PRECISION", "scale_mode"), npu.value("OPA_SCALE", "scale"),
                     npu.value("OPA_SCALE", "shift"), npu.value("OPB_SCALE", "scale")),
        round_modes=(npu.name("IFM_PRECISION", "round_mode"), npu.name("OFM_PRECISION", "round_mode")),
        ofm_scale=(npu.value("OFM_SCALE", "scale"), npu.value("OFM_SCALE", "shift")), bits=ifm.bits)
    if out is None:
        raise UnsupportedCommandError(f"{npu.memory.where}: elementwise mode {mode} is not simulated yet",
                                      "run the program's TOSA instead (tosakit run --engine tosa)")
    ofm.write(npu.memory, npu.activation(out + ofm.zero_point, ofm))


def _elementwise_u85(npu: Npu, mode: str, h: int, w: int, c: int) -> None:
    """U85 elementwise: each operand less its zero point and scaled by its own IFM_SCALE / IFM2_SCALE (as a TOSA
    RESCALE before the operation), broadcast along the axes its broadcast mode names or the scalar OP_SCALAR, the
    operation (numerics.U85_ELEMENTWISE), then the OFM scale."""
    name = mode.removeprefix("ELEMENTWISE_MODE_")
    operation = numerics.U85_ELEMENTWISE.get(name) or numerics.U85_UNARY.get(name)
    if operation is None:
        raise UnsupportedCommandError(f"{npu.memory.where}: elementwise mode {mode} is not simulated yet",
                                      "run the program's TOSA instead (tosakit run --engine tosa)")

    def operand(prefix: str, scale: str) -> np.ndarray:
        fm = FeatureMap.of(npu.regs, prefix)
        broadcast = npu.name(f"{prefix}_BROADCAST", "broadcast_mode").removeprefix("BROADCAST_MODE_")
        if broadcast == "SCALAR":  # one shared register holds the operand's stored value
            scalar = "NPU_SET_OP_SCALAR"
            values = np.full((1, 1, 1), npu.regs.signed(scalar, "scalar", 32) if fm.signed
                             else npu.regs.value(scalar, "scalar"))
        else:
            values = npu.read(fm, *(1 if axis in broadcast.replace("NONE", "") else n
                                    for axis, n in zip("HWC", (h, w, c))))
        rounding = U85_IFM_ROUNDING[npu.name(scale, "round_mode")]
        return numerics.scale_output(values - fm.zero_point, npu.value(scale, "scale"), npu.value(scale, "shift"),
                                     rounding)

    if name in numerics.U85_UNARY:
        combined = operation(operand("IFM", "IFM_SCALE"))
    else:
        combined = operation(operand("IFM", "IFM_SCALE"), operand("IFM2", "IFM2_SCALE"))
    ofm = FeatureMap.of(npu.regs, "OFM")
    out = numerics.scale_output(np.broadcast_to(combined, (h, w, c)), npu.value("OFM_SCALE", "scale"),
                                npu.value("OFM_SCALE", "shift"), npu.round_mode()) + ofm.zero_point
    write_ofm(npu, ofm, npu.activation(out, ofm))


@operation("NPU_OP_DMA_START")
def dma(npu: Npu, command) -> None:
    """A copy between regions (weights streamed from flash, LUTs into internal memory); on U85 also 2-D and 3-D
    copies, rows gathered or scattered through an index array."""
    src_region, dst_region = npu.value("DMA0_SRC_REGION", "region"), npu.value("DMA0_DST_REGION", "region")
    src, dst, length = npu.value("DMA0_SRC", "addr"), npu.value("DMA0_DST", "addr"), npu.value("DMA0_LEN", "addr")  # regor names the length "addr"
    check_work(length, npu.memory.where)
    linear = npu.name("DMA0_SRC_REGION", "stride_mode") in ("", "DMA_STRIDE_MODE_D1")
    indexed = npu.u85 and any(npu.name(f"DMA0_{end}_REGION", "idx_mode").endswith("ENABLED") for end in ("SRC", "DST"))
    if npu.name("DMA0_DST_REGION", "region_mode").endswith("INTERNAL"):
        if not linear or indexed:
            raise UnsupportedCommandError(f"{npu.memory.where}: a strided or indexed DMA into internal memory is not "
                                          "simulated", "run the program's TOSA instead (tosakit run --engine tosa)")
        if dst < npu.shram.size - LUT_BYTES or dst + length > npu.shram.size:
            raise TosakitError(f"{npu.memory.where} writes internal bytes [{dst:#x}, {dst + length:#x}), outside "
                               f"its LUT area [{npu.shram.size - LUT_BYTES:#x}, {npu.shram.size:#x})",
                               "the command stream is corrupt: recompile the program")
        npu.shram[dst: dst + length] = np.frombuffer(npu.memory.read_bytes(src_region, src, length), np.uint8)
        at = dst - (npu.shram.size - LUT_BYTES)
        npu.lut_written[at: at + length] = True
    elif linear and not indexed:
        npu.memory.copy(src_region, src, dst_region, dst, length)
    elif npu.u85:
        _rows_dma(npu, (src_region, src), (dst_region, dst), length)
    else:
        raise UnsupportedCommandError(f"{npu.memory.where}: 2-D and 3-D DMA are not simulated yet on the Ethos-U55/U65",
                                      "run the program's TOSA instead (tosakit run --engine tosa)")


def _rows_dma(npu: Npu, source: tuple[int, int], dest: tuple[int, int], length: int) -> None:
    """U85 2-D/3-D DMA: SIZE1 blocks of SIZE0 rows of LEN bytes, each end stepping by its STRIDE0 per row and its
    STRIDE1 per block; with an index array (int32, read in order, IDX_SKIP1 more bytes skipped per block) the
    indexed end's row is the index (a gather reads, a scatter writes, row idx; an index above IDX_MAX is an error)."""
    mode = npu.name("DMA0_SRC_REGION", "stride_mode")
    size0 = 1 if mode.endswith("D1") else npu.value("DMA0_SIZE0", "size")
    size1 = npu.value("DMA0_SIZE1", "size") if mode.endswith("D3") else 1
    check_work(size0 * size1 * length, npu.memory.where)
    npu.memory.check_extent(dest[0], (size1, size0, length), 1, "writes")  # before any address array is made
    block, row = np.arange(size1, dtype=np.int64)[:, None], np.arange(size0, dtype=np.int64)[None, :]
    rows = {"SRC": row, "DST": row}
    for end in rows:
        if npu.name(f"DMA0_{end}_REGION", "idx_mode").endswith("ENABLED"):
            skip = npu.value("DMA0_IDX_SKIP1", "addr") if mode.endswith("D3") else 0
            at = npu.value("DMA0_IDX", "addr") + 4 * (block * size0 + row) + block * skip
            index = npu.memory.read(npu.value("DMA0_IDX_REGION", "region"), at, np.int32)
            bound = npu.value("DMA0_IDX_MAX", "idx_max")
            if index.size and (index.min() < 0 or index.max() > bound):
                bad = int(index[(index < 0) | (index > bound)][0])
                raise TosakitError(f"{npu.memory.where} {'gathers' if end == 'SRC' else 'scatters'} row {bad}, outside "
                                   f"0..{bound} (IDX_MAX)", "the program's indices are out of range for the tensor")
            rows[end] = index

    def addresses(end: str, start: int) -> np.ndarray:
        step0, step1 = (npu.value(f"DMA0_{end}_STRIDE{i}", "addr") for i in (0, 1))
        first = start + block * (step1 if size1 > 1 else 0) + rows[end] * step0
        return first[:, :, None] + np.arange(length, dtype=np.int64)

    values = npu.memory.read(source[0], addresses("SRC", source[1]), np.uint8)
    npu.memory.write(dest[0], addresses("DST", dest[1]), values, np.uint8)


def weight_streams(commands, register_map: dict, constant: bytes, budget: int) -> list[bytes]:
    """The weight streams the convolutions of ``commands`` will read, in order, found from the registers alone
    (no data flows into them): read from the constant region, or from where a DMA copied them from it. A guess
    that only speeds a run up (the codec decodes them ahead): at most ``budget`` bytes, each stream once."""
    regs, copies, found, total = Registers(register_map), deque(maxlen=64), {}, 0  # recent copies only
    value = lambda register, field: regs.value(f"NPU_SET_{register}", field)  # noqa: E731
    for command in commands:
        name = command.register.name
        if name == "NPU_OP_DMA_START":
            copies.append((value("DMA0_DST_REGION", "region"), value("DMA0_DST", "addr"),
                           value("DMA0_LEN", "addr"), value("DMA0_SRC_REGION", "region"), value("DMA0_SRC", "addr")))
        elif name in ("NPU_OP_CONV", "NPU_OP_DEPTHWISE") and not value("WEIGHT_FORMAT", "weight_format"):
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
    OPERATIONS[_wait] = lambda npu, command: None
