"""Convolution, depthwise convolution and (U85) the matrix product: the NPU's weighted operations."""

from __future__ import annotations

import numpy as np

from ....targets import ETHOSU_TARGETS
from ..featuremap import FeatureMap
from ..npu import Kernel, Npu, by_blocks, check_work, exact_dot, finish, operation, windows
from ..weights import U85Layout, decode_weights, decode_weights_u85, weight_streams_u85


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
    finish(npu, by_blocks(npu, oh, ow, ic * k.h * k.w,
                           lambda ys, xs: exact_dot(win[ys, xs], w, ([2, 3, 4], [3, 1, 2]))), scale_stream=True)


def _matmul(npu: Npu, oh: int, ow: int, oc: int, ic: int) -> None:
    """U85 MatMul: OFM[y, x, o] = sum over c of (IFM[y, x, c] - zp) x (IFM2[y, o, c] - zp2); IFM2 holds the right-hand
    matrix transposed (Vela writes it so), a row of it per OFM row; OFM_SCALE, no bias."""
    check_work(oh * ow * oc * ic, npu.memory.where)
    ifm, ifm2 = FeatureMap.of(npu.regs, "IFM"), FeatureMap.of(npu.regs, "IFM2")
    a = npu.read(ifm, oh, ow, ic) - ifm.zero_point
    b = npu.read(ifm2, oh, oc, ic) - ifm2.zero_point
    finish(npu, np.stack([exact_dot(a[y], b[y], ([1], [1])) for y in range(oh)]), scale_stream=False)


@operation("NPU_OP_DEPTHWISE")
def depthwise(npu: Npu, command) -> None:
    """Depthwise convolution: each channel with its own kernel."""
    oh, ow, oc = npu.ofm_shape()
    w = _weights(npu, npu.kernel(), oc, oc, depthwise=True)[:, :, :, 0]  # [C, KH, KW]
    win, _, ifm, k = windows(npu, oc)
    finish(npu, np.einsum("hwckl,ckl->hwc", win, w.astype(np.int64)), scale_stream=True)


def _weights(npu: Npu, k: Kernel, ic: int, oc: int, depthwise: bool) -> np.ndarray:
    """The operation's weights, decoded from its streams (kept on the NPU: the performance model reads them)."""
    npu.weights = _decoded(npu, k, ic, oc, depthwise)
    return npu.weights


def _decoded(npu: Npu, k: Kernel, ic: int, oc: int, depthwise: bool) -> np.ndarray:
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
