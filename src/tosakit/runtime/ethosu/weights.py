"""An NPU operation's weight and scale streams, read back into tensors.

Weights are compressed by Vela's codec (decoded here by ``ethosu.mlw_codec.decode``, the codec Vela ships, in
a process of its own: ``codec``) after a reordering into the order the NPU's MAC array consumes them: OFM
blocks, then IFM blocks, then sub-kernels (at most 8x8, 4x4 when dilated), then micro-blocks of OFM and IFM
depth. ``brick_order`` states
that order as data; ``decode_weights`` inverts it. The scale stream holds one 10-byte record per OFM channel:
a 40-bit signed bias, a 32-bit scale and a 6-bit shift."""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ...errors import TosakitError
from .codec import CODEC

SCALE_RECORD_BYTES = 10
SUBKERNEL_MAX = 8  # the largest sub-kernel (height and width) the NPU traverses in one pass
IFM_UBLOCK_DEPTH = 8
_FIX = "the weight stream is damaged or was not written by Vela: compile the model again"


def ofm_ublock_depth(accelerator: str) -> int:
    """The OFM micro-block depth: channels produced together by the MAC array."""
    return 4 if accelerator.endswith("-32") else 8


@dataclass(frozen=True)
class ScaleRecord:
    """Per OFM channel: the bias added to the accumulator, then the output scale and shift."""

    bias: np.ndarray  # int64 [depth]
    scale: np.ndarray  # int64 [depth], unsigned 32-bit
    shift: np.ndarray  # int64 [depth], 0..63


def decode_scales(data: bytes, depth: int) -> ScaleRecord:
    """The first ``depth`` bias/scale records of a scale stream."""
    need = depth * SCALE_RECORD_BYTES
    if len(data) < need:
        raise TosakitError(f"the scale stream holds {len(data)} bytes, {depth} OFM channels need {need}", _FIX)
    raw = np.frombuffer(bytes(data[:need]), np.uint8).reshape(depth, SCALE_RECORD_BYTES).astype(np.int64)
    little = lambda cols: sum(raw[:, c] << (8 * i) for i, c in enumerate(cols))  # noqa: E731
    bias = little(range(5))
    bias = np.where(bias >= 1 << 39, bias - (1 << 40), bias)
    return ScaleRecord(bias, little(range(5, 9)), raw[:, 9] & 0x3F)


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
    """Decoded weight tensors by (stream bytes, layout), least recently used dropped past a byte budget: a
    program run again decodes nothing (the key is the content, so weights DMA'd into scratch are safe)."""

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
        return any(key[0] == data for key in self.items)

    def put(self, key, weights: np.ndarray) -> None:
        self.items[key] = weights
        self.nbytes += weights.nbytes + len(key[0])
        while self.nbytes > self.BUDGET and len(self.items) > 1:
            (data, *_), old = self.items.popitem(last=False)
            self.nbytes -= old.nbytes + len(data)


_DECODED = _Decoded()


def clear_caches() -> None:
    """Forget every decoded stream and brick order: the next run is a program's first."""
    _DECODED.__init__()
    brick_order.cache_clear()


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
    key = (bytes(data), kernel_h, kernel_w, ifm_depth, ofm_depth, ofm_block_depth, depthwise, weight_order,
           decomposition, dilation, ifm_bits, ofm_ublock_depth(accelerator))
    found = _DECODED.get(key)
    if found is None:
        found = _decode(key, deadline)
        _DECODED.put(key, found)
    return found.astype(np.int64)


def _decode(key, deadline: float | None) -> np.ndarray:
    (data, kernel_h, kernel_w, ifm_depth, ofm_depth, ofm_block_depth, depthwise, weight_order, decomposition,
     dilation, ifm_bits, ofm_ublock) = key
    values = CODEC.decode(data, deadline)
    need = ofm_depth * kernel_h * kernel_w * (1 if depthwise else ifm_depth)
    if values.size < need:  # checked before the brick order is built: a damaged stream's shape can be huge
        raise TosakitError(f"the weight stream decodes to {values.size} weights; a {kernel_h}x{kernel_w} kernel "
                           f"from {ifm_depth} to {ofm_depth} channels needs {need}", _FIX)
    sub = 4 if decomposition.endswith("D4X4") else SUBKERNEL_MAX
    order = brick_order(ofm_depth, kernel_h, kernel_w, ifm_depth, ofm_block_depth=min(ofm_block_depth, ofm_depth),
                        depthwise=depthwise, part_kernel_first=weight_order.endswith("PART_KERNEL_FIRST"),
                        ifm_bits=ifm_bits, decomposition=(sub // dilation[0], sub // dilation[1]),
                        ofm_ublock=ofm_ublock)
    if values.size < order.size:
        raise TosakitError(f"the weight stream decodes to {values.size} weights; a {kernel_h}x{kernel_w} kernel "
                           f"from {ifm_depth} to {ofm_depth} channels in the NPU's order needs {order.size}", _FIX)
    weights = np.zeros(need, np.int16)  # int9 values
    used = order >= 0
    weights[order[used]] = values[: order.size][used]
    return weights.reshape(ofm_depth, kernel_h, kernel_w, 1 if depthwise else ifm_depth)
