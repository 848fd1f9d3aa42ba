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
        return _int64(np.where(product < 0, -magnitude, magnitude))
    half = np.where(shift > 0, np.left_shift(1, np.maximum(shift - 1, 0)), 0).astype(dtype)
    if round_mode.endswith("DBL"):
        half = half + np.where(shift > 31, np.where(product >= 0, 1 << 30, -(1 << 30)), 0).astype(dtype)
    return _int64((product + half) >> shift.astype(dtype))


def _int64(values: np.ndarray) -> np.ndarray:
    """Saturated to int64 (values beyond it come only from damaged scales; the OFM's clip follows anyway)."""
    if values.dtype == object:
        values = np.minimum(np.maximum(values, -(1 << 63)), (1 << 63) - 1)
    return np.asarray(values).astype(np.int64)


def reciprocal_scale(count: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (scale, shift) of 1/count, as the TOSA spec's ``reciprocal_scale`` defines it."""
    count = np.asarray(count, np.int64)
    k = np.ceil(np.log2(np.maximum(count, 1))).astype(np.int64)  # (1 << k) / 2 < count <= (1 << k)
    return (((1 << 30) + 1) << k) // np.maximum(count, 1), 30 + k


UNARY = ("ELEMENTWISE_MODE_ABS", "ELEMENTWISE_MODE_CLZ", "ELEMENTWISE_MODE_LRELU")
# In the 32-bit input scaling modes (OPA_32, OPB_32) of ADD and SUB, the operand that is not scaled is
# shifted left by this many bits, by IFM precision: the "input shift" of Vela's advanced add/sub scaling
# (20 for 8-bit, 15 for 16-bit) less the one bit its 2 x max-scale normalisation takes.
UNSCALED_SHIFT = {8: 19, 16: 14}


def times(a: np.ndarray, b) -> np.ndarray:
    """``a * b`` exactly (Python integers where int64 could overflow)."""
    if _wide(a, b):
        return np.asarray(a, object) * np.asarray(b, object)
    return a * b


def elementwise(mode: str, a: np.ndarray, b: np.ndarray | None, *, zero_points: tuple[int, int],
                input_scale: tuple[str, int, int, int], round_modes: tuple[str, str], ofm_scale: tuple[int, int],
                bits: int) -> np.ndarray | None:
    """One elementwise operation on operands A and B (B None for unary modes), before the OFM zero point and
    the activation. ``input_scale`` is (IFM scale mode, OPA scale, OPA shift, OPB scale), ``round_modes`` the
    IFM's (input scaling) and OFM's, ``ofm_scale`` (scale, shift), ``bits`` the IFM precision. None for a mode
    not simulated."""
    a = np.asarray(a, np.int64) - zero_points[0]
    if b is not None:
        b = np.asarray(b, np.int64) - zero_points[1]
    name = mode.removeprefix("ELEMENTWISE_MODE_")
    if name in ("ADD", "SUB"):
        scale_mode, opa_scale, opa_shift, opb_scale = input_scale
        if scale_mode.endswith("OPA_32"):
            a, b = scale_output(a, opa_scale, opa_shift, round_modes[0]), b << UNSCALED_SHIFT.get(bits, 0)
        elif scale_mode.endswith("OPB_32"):
            a, b = a << UNSCALED_SHIFT.get(bits, 0), scale_output(b, opa_scale, opa_shift, round_modes[0])
        else:  # OPA_OPB_16: integer 16-bit multipliers, no shift
            a, b = times(a, opa_scale), times(b, opb_scale)
        c = a + b if name == "ADD" else a - b
    elif name == "MUL":
        c = times(a, b)
    elif name == "MIN":
        c = np.minimum(a, b)
    elif name == "MAX":
        c = np.maximum(a, b)
    elif name == "ABS":
        c = np.abs(a)
    elif name == "LRELU":
        return np.where(a < 0, scale_output(a, *ofm_scale, round_modes[1]), a)
    else:
        return None  # CLZ, SHL, SHR: no stream in the tests uses them, so no rule here is proven yet
    return scale_output(np.asarray(c), *ofm_scale, round_modes[1])


def _mask(condition: np.ndarray) -> np.ndarray:
    """A comparison's result as the U85 stores it: all bits set (-1) where true, 0 where false, so that AND, OR and
    AND_NOT with it select (Vela builds TOSA SELECT so)."""
    return -np.asarray(condition, np.int64)


# U85 binary elementwise modes on the rescaled operands (a = IFM, b = IFM2), before the OFM scale.
U85_ELEMENTWISE = {
    "ADD": np.add, "SUB": np.subtract, "MUL": times, "MIN": np.minimum, "MAX": np.maximum,
    "CMP_EQ": lambda a, b: _mask(a == b), "CMP_GE": lambda a, b: _mask(a >= b), "CMP_GT": lambda a, b: _mask(a > b),
    "AND": np.bitwise_and, "OR": np.bitwise_or, "XOR": np.bitwise_xor, "AND_NOT": lambda a, b: a & ~b,
}
# U85 unary modes: IFM alone (IFM2's registers are stale).
U85_UNARY = {"NOT": np.invert}

