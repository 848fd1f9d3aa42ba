"""What Vela accepts, as data: TOSA operator limits per Ethos-U family.

The tables follow Vela 5.2's own report (``vela --supported-ops-report``, sections "Ethos-U55 and
Ethos-U65 TOSA" and "Ethos-U85 TOSA"). The partitioner lowers each partition, checks every emitted
TOSA operator here, and leaves the PyTorch node behind a refused operator on the CPU with the
limit in words; Vela itself is the final check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ...lower.tosa_graph import DType, EmittedOp, is_float
from ...targets import ETHOSU_TARGETS

Check = Callable[[EmittedOp], "str | None"]


def _shape(op: EmittedOp, i: int = 0) -> tuple[int, ...]:
    return op.inputs[i].shape


def _kernel_stride(op: EmittedOp) -> tuple[tuple[int, int], tuple[int, int], bool]:
    """(kernel hw, stride hw, padded) of a convolution or pooling op."""
    a = op.attr.args
    if op.op in ("CONV2D", "DEPTHWISE_CONV2D"):
        w = _shape(op, 1)
        kernel = (w[1], w[2]) if op.op == "CONV2D" else (w[0], w[1])
        return kernel, tuple(a[1]), any(a[0])
    if op.op in ("AVG_POOL2D", "MAX_POOL2D"):
        return tuple(a[0]), tuple(a[1]), any(a[2])
    w = _shape(op, 1)  # TRANSPOSE_CONV2D: weights OHWI
    return (w[1], w[2]), tuple(a[1]), any(a[0])


def no_float(op: EmittedOp) -> str | None:
    tensors = [*op.inputs, op.output]
    if any(is_float(t.dtype) for t in tensors if t.dtype != DType.SHAPE):
        return "computes in float; Ethos-U runs integers only (quantize the model)"
    return None


def stride_up_to(limit: int) -> Check:
    def check(op: EmittedOp) -> str | None:
        _, stride, _ = _kernel_stride(op)
        if max(stride) > limit:
            return f"stride {stride[0]}x{stride[1]} exceeds {limit}"
        return None

    return check


def conv_kernel(max_area: int, max_height: int) -> Check:
    def check(op: EmittedOp) -> str | None:
        (kh, kw), _, _ = _kernel_stride(op)
        if kh * kw > max_area or kh > max_height:
            return f"kernel {kh}x{kw} exceeds {max_area} elements or {max_height} rows"
        return None

    return check


def pool_kernel(padded_max: int, area: int, height: int) -> Check:
    def check(op: EmittedOp) -> str | None:
        (kh, kw), _, padded = _kernel_stride(op)
        if padded and max(kh, kw) > padded_max:
            return f"kernel {kh}x{kw} with padding exceeds {padded_max}x{padded_max}"
        if kh * kw > area or kh > height:
            return f"kernel {kh}x{kw} exceeds {area} elements or {height} rows"
        return None

    return check


def feature_map_axes(limit: int, batch_one: bool) -> Check:
    def check(op: EmittedOp) -> str | None:
        shape = _shape(op)
        if batch_one and shape and shape[0] != 1:
            return f"batch {shape[0]}: only batch 1 runs on the NPU"
        if any(d > limit for d in shape[1:]):
            return f"a feature map axis of {list(shape)} exceeds {limit}"
        return None

    return check


def conv_weight_sum(op: EmittedOp) -> str | None:
    weights = op.inputs[1].data
    if weights is None:
        return "weights are not constant"
    axis = tuple(range(1, weights.ndim)) if op.op == "CONV2D" else (0, 1)
    worst = int(np.abs(weights.astype(np.int64)).sum(axis=axis).max())
    if worst > 127 * 65536:
        return f"sum of absolute weights {worst} exceeds 127*65536"
    return None


def bias_int40(op: EmittedOp) -> str | None:
    bias = op.inputs[2].data
    if bias is not None and bias.size and np.abs(bias.astype(np.int64)).max() >= 2**39:
        return "bias does not fit in int40"
    return None


def transpose_conv_strides(op: EmittedOp) -> str | None:
    (kh, kw), stride, _ = _kernel_stride(op)
    ih, iw = _shape(op)[1:3]
    ok = stride in ((1, 1), (2, 2)) or (stride == (1, 2) and ih == kh == 1) or (stride == (2, 1) and iw == kw == 1)
    return None if ok else f"stride {stride[0]}x{stride[1]} is not (1,1) or (2,2)"


def argmax_limits(op: EmittedOp) -> str | None:
    shape = _shape(op)
    if op.attr.args[0] != len(shape) - 1:
        return "only an arg-max over the channel (last) axis runs on the NPU"
    if len(shape) > 4 or (len(shape) == 4 and shape[0] != 1) or shape[-1] > 127:
        return f"arg-max input {list(shape)}: needs rank <= 4, batch 1 and at most 127 channels"
    if int(np.prod(shape[:-1])) > 65536:
        return f"arg-max over {list(shape)}: W*H exceeds 65536"
    return None


def matmul_limits(op: EmittedOp) -> str | None:
    a, b = _shape(op, 0), _shape(op, 1)
    dtypes = (op.inputs[0].dtype, op.inputs[1].dtype)
    if dtypes != (DType.INT8, DType.INT8):
        return (f"MATMUL runs on int8 x int8 only, not {' x '.join(d.name.lower() for d in dtypes)}: quantize it "
                "with int8 activations")
    if b[1] * b[2] > 65536 or a[2] > 65536:
        return f"MATMUL operands {list(a)} x {list(b)}: W*C exceeds 65536"
    return None


def resize_power_of_two(op: EmittedOp) -> str | None:
    scale = op.inputs[1].data
    if scale is None:
        return None
    ups = [int(scale[0] // scale[1]) if scale[0] % scale[1] == 0 else 0,
           int(scale[2] // scale[3]) if scale[2] % scale[3] == 0 else 0]
    if any(u not in (1, 2, 4, 8) for u in ups) or ups == [1, 1]:
        return f"upscale {scale[0]}/{scale[1]} x {scale[2]}/{scale[3]} is not a power of two from 2x to 8x"
    return None


def dtypes(*allowed) -> Check:
    names = {d.name if hasattr(d, "name") else str(d) for d in allowed}

    def check(op: EmittedOp) -> str | None:
        for t in [*op.inputs[:1], op.output]:
            name = t.dtype.name if hasattr(t.dtype, "name") else str(t.dtype)
            if name not in names:
                return f"{name} tensors are not supported (only {', '.join(sorted(names))})"
        return None

    return check


def reduce_limits(op: EmittedOp) -> str | None:
    shape = _shape(op)
    axis = op.attr.args[0]
    if shape[axis] > 65536:
        return f"reduced axis of {shape[axis]} exceeds 65536"
    if axis != len(shape) - 1:
        before, after = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:]))
        if before > 65536 or after > 65536:
            return f"reduction over axis {axis} of {list(shape)}: the axes around it exceed 65536"
    return None


def reverse_hw(op: EmittedOp) -> str | None:
    rank = len(_shape(op))
    if op.attr.args[0] not in (rank - 2, rank - 3):
        return "only reversing the W or H axis runs on the NPU"
    return None


def no_downcast_from_int32(op: EmittedOp) -> str | None:
    src, dst = op.inputs[0].dtype, op.output.dtype
    if DType.BOOL in (src, dst):
        return "bool casts are not supported"
    if src == DType.INT32 and dst in (DType.INT8, DType.INT16):
        return "down-casting from int32 is not supported"
    return None


def transpose_limits(op: EmittedOp) -> str | None:
    shape, perms = _shape(op), list(op.attr.args[0])
    if op.inputs[0].dtype == DType.BOOL:
        return "bool tensors cannot be transposed on the NPU"
    if op.inputs[0].dtype == DType.INT32 and len(shape) > 4:
        return f"int32 TRANSPOSE of rank {len(shape)} (at most 4)"
    moved = [d for i, d in enumerate(perms) if d != i]
    if len(shape) >= 3 and moved:
        rest = [s for i, s in enumerate(shape) if i in moved]
        if len(rest) > 2 and int(np.prod(sorted(rest)[:-2])) > 65536:
            return f"TRANSPOSE {perms} of {list(shape)}: the moved axes are too large"
    return None


def max_rank(limit: int) -> Check:
    def check(op: EmittedOp) -> str | None:
        rank = max(len(t.shape) for t in [*op.inputs, op.output] if t.dtype != DType.SHAPE)
        return f"rank {rank} exceeds {limit}" if rank > limit else None

    return check


def constant_weights(op: EmittedOp) -> str | None:
    return None if op.inputs[1].data is not None else "weights computed at run time are not supported"


@dataclass(frozen=True)
class TargetLimits:
    """The TOSA operators one Ethos-U family refuses outright, and the limits on the rest."""

    family: str
    unsupported: frozenset[str]
    every_op: tuple[Check, ...]
    checks: dict[str, tuple[Check, ...]] = field(default_factory=dict)

    def refusal(self, op: EmittedOp) -> str | None:
        """Why this Ethos-U family cannot run ``op`` (None when it can)."""
        if op.op in self.unsupported:
            return f"TOSA {op.op} is not supported on {self.family}"
        for check in (*self.every_op, *self.checks.get(op.op, ())):
            why = check(op)
            if why:
                return f"{op.op} on {self.family}: {why}"
        return None


_I8_16_32 = dtypes(DType.INT8, DType.INT16, DType.INT32)
_POOL = (feature_map_axes(65536, batch_one=True), pool_kernel(8, 65536, 256), stride_up_to(3))
_CONV = (conv_kernel(4096, 64), stride_up_to(3), conv_weight_sum, bias_int40)

U55_U65 = TargetLimits(
    family="Ethos-U55/U65",
    unsupported=frozenset({
        "BITWISE_AND", "BITWISE_OR", "BITWISE_XOR", "BITWISE_NOT", "INTDIV", "LOGICAL_AND", "LOGICAL_RIGHT_SHIFT",
        "LOGICAL_OR", "LOGICAL_XOR", "LOGICAL_NOT", "SELECT", "EQUAL", "GREATER", "GREATER_EQUAL", "REDUCE_ALL",
        "REDUCE_ANY", "GATHER", "SCATTER",
    }),
    every_op=(no_float, max_rank(6)),
    checks={
        "CONV2D": _CONV,
        "DEPTHWISE_CONV2D": (conv_kernel(4096, 64), stride_up_to(3), bias_int40),
        "TRANSPOSE_CONV2D": (conv_kernel(4096, 64), transpose_conv_strides, constant_weights),
        "AVG_POOL2D": _POOL,
        "MAX_POOL2D": (feature_map_axes(65536, batch_one=False), pool_kernel(65536, 65536, 256), stride_up_to(3)),
        "ARGMAX": (argmax_limits,),
        "MATMUL": (matmul_limits,),
        "RESIZE": (resize_power_of_two,),
        "TABLE": (dtypes(DType.INT8),),
        "TRANSPOSE": (transpose_limits,),
        "REDUCE_SUM": (reduce_limits,),
        "REDUCE_MAX": (dtypes(DType.INT8, DType.INT16),),
        "REDUCE_MIN": (dtypes(DType.INT8, DType.INT16),),
        "CONCAT": (_I8_16_32,),
        "RESHAPE": (_I8_16_32,),
        "IDENTITY": (_I8_16_32,),
        "SLICE": (_I8_16_32,),
        "TILE": (_I8_16_32,),
        "PAD": (_I8_16_32,),
        "REVERSE": (dtypes(DType.INT8, DType.INT16), reverse_hw),
        "CAST": (no_downcast_from_int32,),
    },
)

# Ethos-U85 takes TOSA 1.0 PRO-INT at level 8k, except run-time weights for transposed/3-D convolution.
U85 = TargetLimits(
    family="Ethos-U85",
    unsupported=frozenset(),
    every_op=(no_float, max_rank(6)),
    checks={
        "CONV2D": (conv_kernel(8192 * 8192, 8192),),
        "DEPTHWISE_CONV2D": (conv_kernel(8192 * 8192, 8192),),
        "TRANSPOSE_CONV2D": (constant_weights,),
        "AVG_POOL2D": (pool_kernel(8192, 8192 * 8192, 8192),),
        "MAX_POOL2D": (pool_kernel(8192, 8192 * 8192, 8192),),
    },
)


def limits_for(target: str) -> TargetLimits:
    """The limits table of an Ethos-U target name."""
    return U85 if ETHOSU_TARGETS[target].family == "u85" else U55_U65
