"""Elementwise operations: binary and unary, with IFM2 broadcast or a scalar operand."""

from __future__ import annotations

import numpy as np

from ....errors import RUN_TOSA_HINT
from .. import numerics
from ..featuremap import FeatureMap
from ..npu import Npu, UnsupportedCommandError, check_work, operation, u85_runs, write_ofm


@operation("NPU_OP_ELEMENTWISE", elementwise_mode={f"ELEMENTWISE_MODE_{m}" for m in (
    *numerics.U85_ELEMENTWISE, *numerics.U85_UNARY)})
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
                                      RUN_TOSA_HINT)
    ofm.write(npu.memory, npu.activation(out + ofm.zero_point, ofm))


# U85's IFM rounding modes by the U55 names numerics.scale_output takes (the ones Vela writes for TOSA).
U85_IFM_ROUNDING = {"ROUND_MODE_IFM_NATURAL": "ROUND_MODE_NATURAL", "ROUND_MODE_IFM_DOUBLE_SYMMETRIC": "ROUND_MODE_DBL"}
u85_runs("NPU_SET_IFM_SCALE", "dbl_rnd", {0})
u85_runs("NPU_SET_IFM2_SCALE", "dbl_rnd", {0})


def _elementwise_u85(npu: Npu, mode: str, h: int, w: int, c: int) -> None:
    """U85 elementwise: each operand less its zero point and scaled by its own IFM_SCALE / IFM2_SCALE (as a TOSA
    RESCALE before the operation), broadcast along the axes its broadcast mode names or the scalar OP_SCALAR, the
    operation (numerics.U85_ELEMENTWISE), then the OFM scale."""
    name = mode.removeprefix("ELEMENTWISE_MODE_")
    operation = numerics.U85_ELEMENTWISE.get(name) or numerics.U85_UNARY.get(name)
    if operation is None:
        raise UnsupportedCommandError(f"{npu.memory.where}: elementwise mode {mode} is not simulated yet",
                                      RUN_TOSA_HINT)

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
