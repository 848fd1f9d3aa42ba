"""Pooling (max, min, average, sum, reductions) and (U85) resize: the NPU's unweighted window operations."""

from __future__ import annotations

import numpy as np

from ....errors import RUN_TOSA_HINT
from .. import numerics
from ..featuremap import FeatureMap
from ..npu import Npu, UnsupportedCommandError, by_blocks, check_work, finish, operation, windows


@operation("NPU_OP_POOL", pooling_mode={f"POOLING_MODE_{m}" for m in (
    "MAX", "MIN", "AVERAGE", "SUM", "REDUCE_SUM", "NONE")})
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
                                      RUN_TOSA_HINT)
    finish(npu, acc, scale_stream=False)


@operation("NPU_OP_RESIZE", resize_mode={"RESIZE_MODE_BILINEAR", "RESIZE_MODE_NEAREST"})
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
                                      RUN_TOSA_HINT)
    finish(npu, acc << 16, scale_stream=False)
