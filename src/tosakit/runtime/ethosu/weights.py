"""An NPU operation's weight and scale streams, read back into tensors.

Ethos-U55/U65: weights are compressed by Vela's codec (decoded here by ``ethosu.mlw_codec.decode``, the codec
Vela ships, in a process of its own: ``codec``) after a reordering into the order the NPU's MAC array
consumes them: OFM blocks, then IFM blocks, then sub-kernels (at most 8x8, 4x4 when dilated), then
micro-blocks of OFM and IFM depth. ``brick_order`` states that order as data; ``decode_weights`` inverts it.
The scale stream holds one 10-byte record per OFM channel: a 40-bit signed bias, a 32-bit scale and a 6-bit
shift.

Ethos-U85 (``U85Layout``, ``decode_weights_u85``): one stream per core in the standard format (SWD, the same
codec), or one stream in the fast-decode format (FWD: a 32-byte header, then 8-bit values or 2/4-bit indices
into a 16-entry table); 2:4 sparse weights keep every value (zeros too) in a sparse variant of the order. The
order is the U85's own: serpentine IFM blocks and kernel rows, OFM channels dealt to the cores in groups of 4.
Its records hold a 32-bit bias, a 31-bit scale and a shift (48-bit bias and 15-bit scale with a 48-bit
accumulator). Facts from regor's Ethos-U85 weight encoder, each checked against Vela 5.2's output."""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ...errors import DAMAGED_WEIGHTS_HINT, TosakitError
from .codec import CODEC

SCALE_RECORD_BYTES = 10
SUBKERNEL_MAX = 8  # the largest sub-kernel (height and width) the NPU traverses in one pass
IFM_UBLOCK_DEPTH = 8


def ofm_ublock_depth(accelerator: str) -> int:
    """The OFM micro-block depth: channels produced together by the MAC array."""
    return 4 if accelerator.endswith("-32") else 8


@dataclass(frozen=True)
class ScaleRecord:
    """Per OFM channel: the bias added to the accumulator, then the output scale and shift."""

    bias: np.ndarray  # int64 [depth]
    scale: np.ndarray  # int64 [depth], unsigned
    shift: np.ndarray  # int64 [depth], 0..63


# Record layouts, by name: (bias bytes, scale bytes, scale bits, shift byte); bytes little-endian, in order.
RECORDS = {"u55": (5, 4, 32, 9), "u85_acc32": (4, 4, 31, 8), "u85_acc48": (6, 2, 15, 8)}


def decode_scales(data: bytes, depth: int, record: str = "u55") -> ScaleRecord:
    """The first ``depth`` bias/scale records of a scale stream, laid out as ``RECORDS[record]`` says."""
    need = depth * SCALE_RECORD_BYTES
    if len(data) < need:
        raise TosakitError(f"the scale stream holds {len(data)} bytes, {depth} OFM channels need {need}", DAMAGED_WEIGHTS_HINT)
    bias_bytes, scale_bytes, scale_bits, shift_at = RECORDS[record]
    raw = np.frombuffer(bytes(data[:need]), np.uint8).reshape(depth, SCALE_RECORD_BYTES).astype(np.int64)
    little = lambda cols: sum(raw[:, c] << (8 * i) for i, c in enumerate(cols))  # noqa: E731
    bias = little(range(bias_bytes))
    bias = np.where(bias >> (8 * bias_bytes - 1), bias - (1 << (8 * bias_bytes)), bias)
    scale = little(range(bias_bytes, bias_bytes + scale_bytes)) & ((1 << scale_bits) - 1)
    return ScaleRecord(bias, scale, raw[:, shift_at] & 0x3F)


@functools.lru_cache(maxsize=64)  # layers of one shape share it: a program's first run builds each once
def brick_order(ofm_depth: int, kernel_h: int, kernel_w: int, ifm_depth: int, *, ofm_block_depth: int,
                depthwise: bool, part_kernel_first: bool, ifm_bits: int, decomposition: tuple[int, int],
                ofm_ublock: int) -> np.ndarray:
    """For each weight of the (uncompressed) stream, its flat index in an [OFM, KH, KW, IFM] tensor (IFM 1
    for depthwise), or -1 where the stream holds padding."""
    shape = _Layout(ofm_depth, kernel_h, kernel_w, 1 if depthwise else ifm_depth, depthwise, part_kernel_first,
                    ifm_bits, decomposition, ofm_ublock)
    # Every full OFM block repeats the first one's order, moved by its first channel; a last partial block
    # has fewer micro-blocks and is built on its own.
    full, rest = divmod(ofm_depth, ofm_block_depth)
    pieces = []
    if full:
        first = shape.block(0, ofm_block_depth)
        moved = first[None, :] + np.arange(full)[:, None] * (ofm_block_depth * shape.per_ofm)
        pieces.append(np.where(first >= 0, moved, -1).reshape(-1))
    if rest:
        pieces.append(shape.block(full * ofm_block_depth, rest))
    order = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    order.flags.writeable = False  # shared through the cache
    return order


@dataclass(frozen=True)
class _Layout:
    """A weight tensor's shape and the stream order's parameters (``brick_order``'s arguments)."""

    ofm_depth: int
    kernel_h: int
    kernel_w: int
    ifm_depth: int  # 1 for depthwise
    depthwise: bool
    part_kernel_first: bool
    ifm_bits: int
    decomposition: tuple[int, int]
    ofm_ublock: int

    @property
    def per_ofm(self) -> int:
        return self.kernel_h * self.kernel_w * self.ifm_depth

    def block(self, ofm_block_z: int, block_depth: int) -> np.ndarray:
        """The order of one OFM block: IFM blocks, then sub-kernels, each a nest of micro-blocks."""
        ifm_block = 16 if self.part_kernel_first or self.ifm_bits == 16 else 32
        pieces = []
        for ifm_block_z in range(0, self.ifm_depth, ifm_block):
            if self.depthwise:
                block_ifm = IFM_UBLOCK_DEPTH
            elif self.part_kernel_first:
                block_ifm = min(ifm_block, self.ifm_depth - ifm_block_z)
            else:
                block_ifm = ifm_block
            for sy in range(0, self.kernel_h, self.decomposition[0]):
                for sx in range(0, self.kernel_w, self.decomposition[1]):
                    pieces.append(self.subkernel(ofm_block_z, block_depth, ifm_block_z, block_ifm, sy, sx))
        return np.concatenate(pieces)

    def subkernel(self, ofm_block_z: int, block_depth: int, ifm_block_z: int, block_ifm: int, sy: int,
                  sx: int) -> np.ndarray:
        """One sub-kernel's nest, outermost first: outer IFM micro-block (part-kernel-first), OFM micro-block,
        kernel element, inner IFM micro-block (depth-first), OFM depth in the micro-block, IFM depth in it."""
        sub_h = min(self.kernel_h - sy, self.decomposition[0])
        sub_w = min(self.kernel_w - sx, self.decomposition[1])
        elements = sub_w * sub_h
        if self.part_kernel_first:
            elements = -(-elements // (2 if self.ifm_bits == 16 else 4)) * (2 if self.ifm_bits == 16 else 4)
        elif self.depthwise:
            elements = -(-elements // 4) * 4
        ublocks = lambda n: np.arange(0, n, IFM_UBLOCK_DEPTH)  # noqa: E731
        outer = ublocks(block_ifm if self.part_kernel_first else 1)[:, None, None, None, None, None]
        inner = ublocks(1 if self.part_kernel_first else block_ifm)[None, None, None, :, None, None]
        ofm_ublk = np.arange(0, block_depth, self.ofm_ublock)[None, :, None, None, None, None]
        e = np.arange(elements)[None, None, :, None, None, None]
        ofm_z = np.arange(self.ofm_ublock)[None, None, None, None, :, None]
        ifm_z = np.arange(1 if self.depthwise else IFM_UBLOCK_DEPTH)[None, None, None, None, None, :]
        ky, kx = sy + e // sub_w, sx + e % sub_w
        ofm = ofm_block_z + ofm_ublk + ofm_z
        ifm = ifm_block_z + outer + inner + ifm_z
        valid = (ifm < self.ifm_depth) & (ofm < self.ofm_depth) & (e // sub_w < sub_h)
        flat = ((ofm * self.kernel_h + ky) * self.kernel_w + kx) * self.ifm_depth + ifm
        return np.where(valid, flat, -1).reshape(-1)


class _Decoded:
    """Decoded weight tensors by (digest of the stream bytes, layout), least recently used dropped past a byte
    budget: a program run again decodes nothing (the key is the content, so weights DMA'd into scratch are safe).
    Values are kept in the narrowest integer type that holds them, so a 28M-weight lm_head stays cached."""

    BUDGET = 64 << 20

    def __init__(self):
        self.items: OrderedDict = OrderedDict()
        self.nbytes = 0

    def get(self, key):
        found = self.items.get(key)
        if found is not None:
            self.items.move_to_end(key)
        return found

    def has_stream(self, data: bytes) -> bool:
        digest = stream_digest(data)
        return any(key[0] == digest if isinstance(key[0], bytes) else digest in key[0] for key in self.items)

    def put(self, key, weights: np.ndarray) -> np.ndarray:
        """Keep ``weights`` (int8 when they fit) under ``key``; the kept array."""
        if weights.size and -128 <= weights.min() and weights.max() <= 127:
            weights = weights.astype(np.int8)
        self.items[key] = weights
        self.nbytes += weights.nbytes
        while self.nbytes > self.BUDGET and len(self.items) > 1:
            _, old = self.items.popitem(last=False)
            self.nbytes -= old.nbytes
        return weights


_DECODED = _Decoded()


def stream_digest(data: bytes) -> bytes:
    """The content key of one weight stream."""
    return hashlib.blake2b(data, digest_size=16).digest()


def clear_caches() -> None:
    """Forget every decoded stream and brick order: the next run is a program's first."""
    _DECODED.__init__()
    brick_order.cache_clear()
    _u85_order.cache_clear()


def decoded(data: bytes) -> bool:
    """Whether the weight stream ``data`` is decoded already (for some layout)."""
    return _DECODED.has_stream(data)


def decode_weights(data: bytes, *, kernel_h: int, kernel_w: int, ifm_depth: int, ofm_depth: int,
                   ofm_block_depth: int, depthwise: bool, weight_order: str, decomposition: str,
                   dilation: tuple[int, int], ifm_bits: int, accelerator: str,
                   deadline: float | None = None) -> np.ndarray:
    """The [OFM, KH, KW, IFM] weights (IFM 1 for depthwise; int64, zero point already taken off) of a
    compressed weight stream, as the registers of the operation describe it; decoded by Vela's codec in its
    own process (``codec``), giving up past ``deadline``."""
    layout = (kernel_h, kernel_w, ifm_depth, ofm_depth, ofm_block_depth, depthwise, weight_order, decomposition,
              dilation, ifm_bits, ofm_ublock_depth(accelerator))
    key = (stream_digest(data), *layout)
    found = _DECODED.get(key)
    if found is None:
        found = _DECODED.put(key, _decode(bytes(data), layout, deadline))
    return found.astype(np.int64)


def _decode(data: bytes, layout: tuple, deadline: float | None) -> np.ndarray:
    (kernel_h, kernel_w, ifm_depth, ofm_depth, ofm_block_depth, depthwise, weight_order, decomposition,
     dilation, ifm_bits, ofm_ublock) = layout
    values = CODEC.decode(data, deadline)
    need = ofm_depth * kernel_h * kernel_w * (1 if depthwise else ifm_depth)
    if values.size < need:  # checked before the brick order is built: a damaged stream's shape can be huge
        raise TosakitError(f"the weight stream decodes to {values.size} weights; a {kernel_h}x{kernel_w} kernel "
                           f"from {ifm_depth} to {ofm_depth} channels needs {need}", DAMAGED_WEIGHTS_HINT)
    sub = 4 if decomposition.endswith("D4X4") else SUBKERNEL_MAX
    order = brick_order(ofm_depth, kernel_h, kernel_w, ifm_depth, ofm_block_depth=min(ofm_block_depth, ofm_depth),
                        depthwise=depthwise, part_kernel_first=weight_order.endswith("PART_KERNEL_FIRST"),
                        ifm_bits=ifm_bits, decomposition=(sub // dilation[0], sub // dilation[1]),
                        ofm_ublock=ofm_ublock)
    if values.size < order.size:
        raise TosakitError(f"the weight stream decodes to {values.size} weights; a {kernel_h}x{kernel_w} kernel "
                           f"from {ifm_depth} to {ofm_depth} channels in the NPU's order needs {order.size}", DAMAGED_WEIGHTS_HINT)
    weights = np.zeros(need, np.int16)  # int9 values
    used = order >= 0
    weights[order[used]] = values[: order.size][used]
    return weights.reshape(ofm_depth, kernel_h, kernel_w, 1 if depthwise else ifm_depth)


# ------------------------------------------------------------------ Ethos-U85

# Per MAC count: cores, and the OFM micro-block depth of each micro-block shape (height, width) that
# NPU_SET_ACC_FORMAT's microblock field names.
U85_CORES = {128: 1, 256: 1, 512: 2, 1024: 4, 2048: 4}
U85_UBLOCK_DEPTH = {128: {(1, 2): 8, (1, 1): 16}, 256: {(1, 2): 16, (1, 4): 8, (2, 2): 8},
                    512: {(2, 2): 16, (1, 4): 16}, 1024: {(2, 2): 32, (1, 4): 32, (2, 4): 16},
                    2048: {(2, 2): 64, (1, 4): 64, (4, 4): 16}}
U85_MICROBLOCKS = {0: (1, 1), 1: (1, 2), 2: (1, 4), 3: (2, 2), 4: (2, 4), 5: (4, 4)}  # microblock: (height, width)
FWD_HEADER_BYTES = 32
MAX_WEIGHTS = 1 << 26  # weights of one operation: far beyond any layer an Ethos-U runs


@dataclass(frozen=True)
class U85Layout:
    """What an Ethos-U85 operation's registers say about its weight stream(s): the weight tensor's shape
    ([OFM, KH, KW, IFM], IFM 1 for depthwise), the traversal, blocks, micro-block and the MAC array."""

    ofm_depth: int
    kernel_h: int
    kernel_w: int
    ifm_depth: int
    traversal: str  # "depthwise", "part_kernel" or "depth_first"
    ofm_block_depth: int
    ublock: int  # OFM micro-block depth
    ifm_bits: int
    sparse: bool  # 2:4 sparse
    stride: tuple[int, int]  # y, x
    dilation: tuple[int, int]  # y, x
    macs: int

    @classmethod
    def of(cls, regs, depthwise: bool, macs: int) -> "U85Layout":
        """The layout the registers ``regs`` (a ``featuremap.Registers``) hold for the operation about to run."""
        value = lambda register, field: regs.value(f"NPU_SET_{register}", field)  # noqa: E731
        stride = tuple((value("KERNEL_STRIDE", f"stride_{a}_msb") << 1 | value("KERNEL_STRIDE", f"stride_{a}_lsb")) + 1
                       for a in "yx")
        dilation = tuple(2 if value("KERNEL_STRIDE", f"dilation_{a}") else 1 for a in "yx")
        shape = U85_MICROBLOCKS[value("ACC_FORMAT", "microblock")]
        ublock = U85_UBLOCK_DEPTH[macs].get(shape)
        if ublock is None:
            raise TosakitError(f"micro-block {shape[0]}x{shape[1]} is not one of ethos-u85-{macs}'s", DAMAGED_WEIGHTS_HINT)
        order = "part_kernel" if value("KERNEL_STRIDE", "weight_order") else "depth_first"
        return cls(value("OFM_DEPTH_M1", "depth_m1") + 1, value("KERNEL_HEIGHT_M1", "height_m1") // dilation[0] + 1,
                   value("KERNEL_WIDTH_M1", "width_m1") // dilation[1] + 1,
                   1 if depthwise else value("IFM_DEPTH_M1", "depth_m1") + 1, "depthwise" if depthwise else order,
                   value("OFM_BLK_DEPTH_M1", "depth_m1") + 1, ublock, 8 << value("IFM_PRECISION", "activation_precision"),
                   bool(value("WEIGHT_FORMAT", "weight_sparsity")), stride, dilation, macs)

    @property
    def cores(self) -> int:
        return U85_CORES[self.macs]

    @property
    def ifm_block_depth(self) -> int:
        """Not in a register: the depth regor's block configuration gives the IFM block."""
        if self.traversal == "part_kernel":
            return 16
        if self.ifm_bits == 32 or (self.macs <= 256 and self.ublock == 16 and not self.sparse):
            return 32
        return 128 if self.sparse and self.ifm_bits == 8 else 64

    @property
    def _steps(self) -> tuple[int, int]:
        """Kernel elements a sub-kernel is padded to a multiple of, and the IFM depth of one micro-block."""
        wide = self.ifm_bits == 16 or self.sparse
        if self.traversal == "part_kernel":
            return (10 if wide else 5), (8 if self.ifm_bits == 16 and not self.sparse else self.ifm_block_depth)
        if self.traversal == "depth_first":
            return 1, self.ifm_block_depth
        return 10, 1

    @property
    def fwd_chunk(self) -> int:
        """Values of one core a multi-core FWD stream holds before the next core's."""
        rounding, ifm_ublock = self._steps
        return self.ublock * ifm_ublock * (rounding if self.traversal == "part_kernel" else 1) // self.cores

    def order(self, core: int) -> np.ndarray:
        """For each value of core ``core``'s uncompressed stream, its flat index in the weight tensor, or -1
        where the stream holds padding."""
        return _u85_order(self, core)

    def stream_order(self, fwd: bool) -> list[np.ndarray]:
        """The order of each stream: one per core (SWD), or the cores' orders interleaved in one (FWD)."""
        orders = [self.order(core) for core in range(self.cores)]
        if not fwd or len(orders) == 1:
            return orders
        chunk = self.fwd_chunk
        return [np.concatenate([o[at: at + chunk] for at in range(0, max(map(len, orders)), chunk) for o in orders])]


@functools.lru_cache(maxsize=64)
def _u85_order(layout: U85Layout, core: int) -> np.ndarray:
    L = layout
    depthwise = L.traversal == "depthwise"
    rounding, ifm_ublock = L._steps
    inner = 1 if depthwise else (16 if L.sparse else 8)  # IFM channels of one group
    sy, sx = (1, 1) if L.traversal == "depth_first" else L.stride
    sub_h, sub_w = 8 // L.dilation[0], 8 // L.dilation[1]
    dw_pad = 0 if L.ifm_bits == 8 and L.macs <= 256 else (2 if L.macs <= 512 else 6)
    # One kernel element: IFM groups of the micro-block, this core's OFM groups of 4, 4 OFM, IFM in the group.
    i_grp, o_grp, o_in, i_in = np.meshgrid(np.arange(0, ifm_ublock, inner), np.arange(4 * core, L.ublock, 4 * L.cores),
                                           np.arange(4), np.arange(inner), indexing="ij")
    d_ofm, d_ifm = (o_grp + o_in).reshape(-1), (i_grp + i_in).reshape(-1)
    per_element = d_ofm.size
    pieces: list[np.ndarray] = []
    blocks = list(range(0, L.ifm_depth, L.ifm_block_depth)) if not depthwise else [0]
    for k, ofm_z in enumerate(range(0, L.ofm_depth, L.ofm_block_depth)):
        ofm_left = min(L.ofm_block_depth, L.ofm_depth - ofm_z)
        for ifm_z in (blocks if k % 2 == 0 else blocks[::-1]):  # serpentine over IFM blocks
            ifm_left = 1 if depthwise else min(L.ifm_block_depth, L.ifm_depth - ifm_z)
            for kx0 in range(0, L.kernel_w, sub_w):  # sub-kernels: X outer
                width = min(L.kernel_w - kx0, sub_w)
                for ky0 in range(0, L.kernel_h, sub_h):
                    height = min(L.kernel_h - ky0, sub_h)
                    # Every micro-block (IFM outer, OFM inner) walks the sub-kernel alike: one array for all.
                    ofm = ofm_z + np.arange(0, ofm_left, L.ublock)[None, :, None] + d_ofm
                    ifm = ifm_z + np.arange(0, ifm_left, ifm_ublock)[:, None, None] + d_ifm
                    valid = (ofm < L.ofm_depth) & (ifm < L.ifm_depth)
                    base = np.where(valid, ofm * L.kernel_h * L.kernel_w * L.ifm_depth + ifm, -1)
                    pad = lambda n: np.full(valid.shape[:2] + (n,), -1)  # noqa: E731
                    walk, left = [], -(-(width * height) // rounding) * rounding
                    for py in range(sy):
                        rows = (height + sy - 1 - py) // sy
                        for px in range(sx):
                            cols = (width + sx - 1 - px) // sx
                            for row in range(rows):
                                for col in range(cols):
                                    x = col if row % 2 == 0 else cols - 1 - col  # serpentine rows
                                    ky, kx = ky0 + py + row * sy, kx0 + px + x * sx
                                    walk.append(np.where(valid, base + (ky * L.kernel_w + kx) * L.ifm_depth, -1))
                                    left -= 1
                                    if depthwise and left % rounding == 0 and dw_pad:
                                        walk.append(pad(dw_pad * L.ublock // L.cores))
                    if left > 0:
                        walk.append(pad((left + (dw_pad if depthwise else 0)) * per_element))
                    pieces.append(np.concatenate(walk, axis=2).reshape(-1))
    order = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    order.flags.writeable = False  # shared through the cache
    return order


def decode_fwd(data: bytes, count: int) -> np.ndarray:
    """``count`` weights of a fast-decode (FWD) stream: a 256-bit header (bit 0 raw, bit 1 2-bit indices,
    bits 104..111 the raw values' zero adjust, bits 112..255 sixteen 9-bit table entries, sign in the low
    bit), then one code per weight, bits packed from the least significant of each byte."""
    if len(data) < FWD_HEADER_BYTES:
        raise TosakitError(f"the fast-decode weight stream holds {len(data)} bytes, less than its header", DAMAGED_WEIGHTS_HINT)
    bits = np.unpackbits(np.frombuffer(bytes(data[:FWD_HEADER_BYTES]), np.uint8), bitorder="little")
    number = lambda lsb, width: int(bits[lsb: lsb + width] @ (1 << np.arange(width)))  # noqa: E731
    raw, two_bit = bits[0], bits[1]
    width = 8 if raw else (2 if two_bit else 4)
    need = FWD_HEADER_BYTES + -(-count * width // 8)
    if len(data) < need:
        raise TosakitError(f"the fast-decode weight stream holds {len(data)} bytes, {count} {width}-bit weights "
                           f"need {need}", DAMAGED_WEIGHTS_HINT)
    body = np.frombuffer(bytes(data[FWD_HEADER_BYTES:need]), np.uint8)
    if raw:
        adjust = number(104, 8)
        return body.astype(np.int8).astype(np.int64)[:count] - (adjust - 256 if adjust >= 128 else adjust)
    entries = [number(112 + 9 * k, 9) for k in range(16)]
    table = np.array([-(e >> 1) if e & 1 else e >> 1 for e in entries], np.int64)
    codes = np.unpackbits(body[:, None], axis=1, bitorder="little").reshape(-1, width) @ (1 << np.arange(width))
    return table[codes[:count]]


def decode_weights_u85(streams: list[bytes], layout: U85Layout, fwd: bool,
                       deadline: float | None = None) -> np.ndarray:
    """The [OFM, KH, KW, IFM] weights (int64; IFM 1 for depthwise) of an Ethos-U85 operation's weight streams
    (one per core for SWD, one for FWD)."""
    streams = tuple(bytes(d) for d in streams)
    key = (tuple(map(stream_digest, streams)), layout, fwd)
    found = _DECODED.get(key)
    if found is None:
        found = _DECODED.put(key, _decode_u85(streams, layout, fwd, deadline))
    return found.astype(np.int64)


def _decode_u85(streams: tuple[bytes, ...], layout: U85Layout, fwd: bool, deadline: float | None) -> np.ndarray:
    size = layout.ofm_depth * layout.kernel_h * layout.kernel_w * layout.ifm_depth
    if len(streams) != (1 if fwd else layout.cores):
        raise TosakitError(f"the operation has {len(streams)} weight stream(s); {layout.cores} core(s) in the "
                           f"{'fast-decode' if fwd else 'standard'} format need {1 if fwd else layout.cores}", DAMAGED_WEIGHTS_HINT)
    # What the streams hold bounds the order built next (a damaged stream's registers can name any shape).
    held = sum((len(d) - FWD_HEADER_BYTES) * 4 for d in streams) if fwd else None
    values = None if fwd else [CODEC.decode(d, deadline).astype(np.int64) for d in streams]
    held = held if fwd else sum(v.size for v in values)
    if size > min(held, MAX_WEIGHTS):
        raise TosakitError(f"the weight stream(s) hold at most {held} weights; a {layout.kernel_h}x{layout.kernel_w} "
                           f"kernel from {layout.ifm_depth} to {layout.ofm_depth} channels needs {size}", DAMAGED_WEIGHTS_HINT)
    weights = np.zeros(size, np.int16)  # int9 values
    for k, order in enumerate(layout.stream_order(fwd)):
        got = decode_fwd(streams[k], order.size) if fwd else values[k]
        if got.size < order.size:
            raise TosakitError(f"weight stream {k} decodes to {got.size} weights; the operation's order needs "
                               f"{order.size}", DAMAGED_WEIGHTS_HINT)
        used = order >= 0
        weights[order[used]] = got[: order.size][used]
    return weights.reshape(layout.ofm_depth, layout.kernel_h, layout.kernel_w, layout.ifm_depth)


def weight_streams_u85(regs, read_bytes, cores: int) -> tuple[list[bytes], bool]:
    """The weight stream(s) of the Ethos-U85 operation about to run, and whether they are fast-decode:
    ``read_bytes(region, base, length)`` reads memory; core k's stream is at WEIGHT_BASE (k = 0) or
    WEIGHTk_BASE."""
    value = lambda register, field: regs.value(f"NPU_SET_{register}", field)  # noqa: E731
    fwd = bool(value("WEIGHT_FORMAT", "weight_format"))
    region = value("WEIGHT_REGION", "region")
    names = ["WEIGHT", "WEIGHT1", "WEIGHT2", "WEIGHT3"][: 1 if fwd else cores]
    return [read_bytes(region, value(f"{n}_BASE", "addr"), value(f"{n}_LENGTH", "length")) for n in names], fwd
