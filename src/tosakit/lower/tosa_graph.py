"""A TOSA 1.0 graph under construction, and the values flowing through it."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch
import tosa_serializer as ts

from ..quantize.qdq import QParams

Op = ts.Op
DType = ts.DType

TORCH_TO_TOSA = {
    torch.float32: DType.FP32,
    torch.float16: DType.FP16,
    torch.bfloat16: DType.BF16,
    torch.int8: DType.INT8,
    torch.int16: DType.INT16,
    torch.int32: DType.INT32,
    torch.bool: DType.BOOL,
}
NUMPY_OF = {
    DType.FP32: np.float32,
    DType.FP16: np.float16,
    DType.INT4: np.int8,  # the serializer packs two to a byte
    DType.INT8: np.int8,
    DType.INT16: np.int16,
    DType.INT32: np.int32,
    DType.INT48: np.int64,
    DType.BOOL: np.bool_,
    DType.SHAPE: np.int64,
}
NHWC = (0, 2, 3, 1)


def identity(rank: int) -> tuple[int, ...]:
    return tuple(range(rank))


@dataclass(frozen=True)
class Value:
    """A TOSA tensor standing for a torch value.

    ``order[i]`` is the torch dimension stored at TOSA dimension ``i`` (identity:
    torch layout; ``NHWC``: channels last). ``q`` is set for quantized integers.
    """

    name: str
    shape: tuple[int, ...]
    dtype: object
    order: tuple[int, ...]
    q: QParams | None = None

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def torch_shape(self) -> tuple[int, ...]:
        out = [0] * self.rank
        for i, d in enumerate(self.order):
            out[d] = self.shape[i]
        return tuple(out)

    def tosa_dim(self, torch_dim: int) -> int:
        """Where torch dimension ``torch_dim`` lives in this TOSA tensor."""
        return self.order.index(torch_dim % self.rank)

    def with_(self, **kw) -> "Value":
        return replace(self, **kw)


def storage_order(t: torch.Tensor) -> tuple[int, ...]:
    """The order a tensor's dims sit in memory (ExecuTorch's dim_order): NHWC for a channels-last 4-D
    tensor, else torch order."""
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last):
        return NHWC
    return identity(t.dim())


def is_float(dtype) -> bool:
    return dtype in (DType.FP32, DType.FP16, DType.BF16)


def quantize_multiplier(scale: float, scale32: bool = True) -> tuple[int, int]:
    """Split a positive real scale into (multiplier, shift): scale = multiplier * 2**-shift."""
    if scale <= 0:
        return 0, 2
    bits = 31 if scale32 else 15
    mantissa, exponent = math.frexp(scale)  # scale = mantissa * 2**exponent, 0.5 <= mantissa < 1
    multiplier = round(mantissa * (1 << bits))
    shift = bits - exponent
    if multiplier == 1 << bits:
        multiplier //= 2
        shift -= 1
    if shift > 62:  # tiny scale: give up precision rather than range
        multiplier >>= shift - 62
        shift = 62
    if shift < 2:
        raise ValueError(f"scale {scale} is too large for a TOSA RESCALE")
    return int(multiplier), int(shift)


@dataclass(frozen=True)
class Attr:
    """A TOSA attribute as data: the serializer method's name and its arguments."""

    kind: str
    args: tuple = ()

    def build(self):
        attr = ts.TosaSerializerAttribute()
        getattr(attr, self.kind)(*self.args)
        return attr


def make_attr(kind: str, *args) -> Attr:
    """``make_attr('Conv2dAttribute', pad, stride, dilation, local_bound, acc_type)``."""
    return Attr(kind, tuple(args))


@dataclass(frozen=True)
class TensorInfo:
    """A tensor an op reads or writes: name, shape, dtype, and the data when it is constant."""

    name: str
    shape: tuple[int, ...]
    dtype: object
    data: np.ndarray | None = None


@dataclass(frozen=True)
class EmittedOp:
    """One TOSA operator as emitted: what target-support checks read."""

    op: str
    inputs: tuple[TensorInfo, ...]
    output: TensorInfo
    attr: Attr
    location: str | None = None


def count_ops(ops: list[EmittedOp]) -> dict[str, int]:
    """How many of each TOSA operator, in first-emitted order."""
    count: dict[str, int] = {}
    for o in ops:
        count[o.op] = count.get(o.op, 0) + 1
    return count


class TosaGraph:
    """Builds one TOSA 1.0 basic block with ``tosa_serializer``, and keeps a record of its ops."""

    def __init__(self):
        self.ser = _new_serializer()
        self._consts: dict[tuple, str] = {}
        self._order: list[str] = []  # every tensor, as emitted
        self._inputs: list[str] = []
        self._outputs: list[str] = []
        self.info: dict[str, TensorInfo] = {}
        self.ops: list[EmittedOp] = []
        self.producer: dict[str, EmittedOp] = {}  # output name -> the op that writes it

    def input(self, shape, dtype) -> str:
        t = self.ser.addPlaceholder(list(shape), dtype)
        self._order.append(t.name)
        self._inputs.append(t.name)
        self.info[t.name] = TensorInfo(t.name, tuple(shape), dtype)
        return t.name

    def const(self, array, dtype) -> str:
        """A constant tensor; small constants are shared."""
        array = np.ascontiguousarray(np.asarray(array, dtype=NUMPY_OF[dtype]))
        key = None
        if array.size <= 16:
            key = (int(dtype), array.shape, array.tobytes())
            if key in self._consts:
                return self._consts[key]
        name = self.ser.addConst(list(array.shape), dtype, array).name
        self._order.append(name)
        self.info[name] = TensorInfo(name, tuple(array.shape), dtype, array)
        if key is not None:
            self._consts[key] = name
        return name

    def shape_const(self, values) -> str:
        return self.const(np.asarray(values, dtype=np.int64).reshape(-1), DType.SHAPE)

    def zero_point(self, value: int, dtype) -> str:
        return self.const(np.array([value]), dtype)

    def op(self, op, inputs, shape, dtype, attr: Attr | None = None, location: str | None = None) -> str:
        """Add ``op`` with a fresh output tensor; returns the output name."""
        out = self.ser.addIntermediate(list(shape), dtype)
        self._order.append(out.name)
        attr = attr or Attr(_attr_name(op))
        loc = ts.TosaOpLocation(location) if location else None
        self.ser.addOperator(op, list(inputs), [out.name], attr.build(), loc)
        self.info[out.name] = TensorInfo(out.name, tuple(shape), dtype)
        self.ops.append(EmittedOp(op.name, tuple(self.info[i] for i in inputs), self.info[out.name], attr, location))
        self.producer[out.name] = self.ops[-1]
        return out.name

    def source(self, name: str) -> EmittedOp | None:
        """The op that computes ``name``'s bytes, looking through RESHAPEs (None for inputs and constants)."""
        return self.producer.get(self.before_reshapes(name))

    def before_reshapes(self, name: str) -> str:
        """The tensor a chain of RESHAPEs ending at ``name`` starts from (``name`` itself when no RESHAPE made it)."""
        op = self.producer.get(name)
        while op is not None and op.op == "RESHAPE":
            name = op.inputs[0].name
            op = self.producer.get(name)
        return name

    def _live(self) -> set[str]:
        """The tensors the graph outputs depend on."""
        live = set(self._outputs)
        for name in reversed(self._order):
            if name in live and name in self.producer:
                live.update(i.name for i in self.producer[name].inputs)
        return live

    def needed(self) -> list[EmittedOp]:
        """The emitted ops the outputs marked so far depend on, in order."""
        live = self._live()
        return [o for o in self.ops if o.output.name in live]

    def prune(self) -> None:
        """Drop the ops and constants no output depends on (a rule that emits a value in a better place, an
        activation before the RESHAPE that fed it, leaves the first one unread): the serializer, which cannot
        remove, is built again from the record."""
        live = self._live() | set(self._inputs)
        if all(name in live for name in self._order):
            return
        self.ops = [o for o in self.ops if o.output.name in live]
        self.producer = {o.output.name: o for o in self.ops}
        self._order = [name for name in self._order if name in live]
        self.ser = _new_serializer()
        block = self.ser.currRegion.currBasicBlock
        for name in self._order:
            info = self.info[name]
            if name in self._inputs:
                self.ser.addPlaceholder(list(info.shape), info.dtype)
            elif info.data is not None:
                self.ser.addConst(list(info.data.shape), info.dtype, info.data, name=name)
            else:
                o = self.producer[name]
                block.addTensor(name, list(info.shape), info.dtype)
                self.ser.addOperator(getattr(Op, o.op), [i.name for i in o.inputs], [name], o.attr.build(),
                                     ts.TosaOpLocation(o.location) if o.location else None)
        for name in self._outputs:
            self.ser.addOutputTensor(block.getTensorByName(name))

    def rescale(self, x: str, scale, out_dtype, in_zp: int = 0, out_zp: int = 0, location: str | None = None) -> str:
        """RESCALE ``x`` by a real ``scale`` (a float, or one per channel along the last dim) to ``out_dtype``;
        an int48 input takes 16-bit multipliers."""
        info = self.info[x]
        scales = np.atleast_1d(np.asarray(scale, dtype=np.float64))
        scale32 = info.dtype != DType.INT48
        pairs = [quantize_multiplier(float(s), scale32) for s in scales]
        mult_dtype = DType.INT32 if scale32 else DType.INT16
        mult = self.const(np.array([m for m, _ in pairs], dtype=NUMPY_OF[mult_dtype]), mult_dtype)
        shift = self.const(np.array([s for _, s in pairs], dtype=np.int8), DType.INT8)
        attr = make_attr("RescaleAttribute", scale32, ts.RoundingMode.SINGLE_ROUND, len(pairs) > 1, False, False)
        return self.op(Op.RESCALE, [x, mult, shift, self.zero_point(in_zp, info.dtype),
                                    self.zero_point(out_zp, out_dtype)], info.shape, out_dtype, attr, location)

    @property
    def op_count(self) -> dict[str, int]:
        return count_ops(self.ops)

    def output(self, name: str) -> None:
        """Mark a tensor as a graph output (in call order)."""
        self.ser.addOutputTensor(self.ser.currRegion.currBasicBlock.getTensorByName(name))
        self._outputs.append(name)

    def serialize(self) -> bytes:
        return bytes(self.ser.serialize())


def _new_serializer():
    return ts.TosaSerializer("", targetMajor=1, targetMinor=0, targetPatch=0, targetDraft=False)


def isolate(op: EmittedOp) -> bytes:
    """A TOSA graph of this one operator: its constants kept, its other inputs as graph inputs."""
    g = TosaGraph()
    names = [g.const(t.data, t.dtype) if t.data is not None else g.input(t.shape, t.dtype) for t in op.inputs]
    g.output(g.op(getattr(Op, op.op), names, op.output.shape, op.output.dtype, op.attr))
    return g.serialize()


def _attr_name(op) -> str:
    """Op.REDUCE_MAX -> 'ReduceMaxAttribute' (for attributes without arguments)."""
    return "".join(w.capitalize() for w in op.name.split("_")) + "Attribute"
