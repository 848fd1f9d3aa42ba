"""The NPU's integer arithmetic: output scaling (a 32-bit scale and a 6-bit shift with a rounding mode) and
average pooling, as the TOSA spec's integer rules state them (``apply_scale_32``) and as Vela programs them."""

from __future__ import annotations

import numpy as np

_INT64_SAFE = 1 << 62


def _wide(values: np.ndarray, factor) -> bool:
    """Whether ``values * factor`` can leave int64 (then Python integers carry it)."""
    big = int(np.abs(values).max(initial=0)) * int(np.abs(np.asarray(factor)).max(initial=0))
    return big >= _INT64_SAFE


def scale_output(acc: np.ndarray, scale, shift, round_mode: str) -> np.ndarray:
    """``acc * scale`` shifted right by ``shift`` with the OFM's rounding: NATURAL rounds half up (TOSA's
    single round), DBL is TOSA's double round (an extra half step of 2**30 away from zero when the shift is
    above 31), TRUNCATE rounds toward zero. ``scale`` and ``shift`` are scalars or per OFM channel (last axis)."""
    acc = np.asarray(acc, np.int64)
    scale, shift = np.asarray(scale, np.int64), np.asarray(shift, np.int64)
    dtype = object if _wide(acc, scale) else np.int64
    product = acc.astype(dtype) * scale.astype(dtype)
    if round_mode.endswith("TRUNCATE"):
        magnitude = np.abs(product) >> shift.astype(dtype)
        return np.where(product < 0, -magnitude, magnitude).astype(np.int64)
    half = np.where(shift > 0, np.left_shift(1, np.maximum(shift - 1, 0)), 0).astype(dtype)
    if round_mode.endswith("DBL"):
        half = half + np.where(shift > 31, np.where(product >= 0, 1 << 30, -(1 << 30)), 0).astype(dtype)
    return ((product + half) >> shift.astype(dtype)).astype(np.int64)

UNARY = ("ELEMENTWISE_MODE_ABS", "ELEMENTWISE_MODE_CLZ", "ELEMENTWISE_MODE_LRELU")
