"""Equivalent TOSA forms of one TRANSPOSE; a backend picks the form its compiler runs fastest.

A case (this TransposeCase, or the convolution stem's ``StemCase``) lists its ``forms`` and builds a
``candidate`` graph for each; the backend's ``ChooseForm`` measures them and names the one to emit.

Most layout changes (NCHW <-> NHWC at a delegate's edge, a view after a convolution) swap two
blocks of dimensions: memory ``[outer, X, Y]`` becomes ``[outer, Y, X]``. Vela runs such a swap at
very different speeds depending on how it is spelled:

- ``transpose``: the TRANSPOSE as lowered.
- ``reduced``: the same TRANSPOSE at its lowest rank, size-1 dims dropped and neighbours merged. Ethos-U85 ran
  the 5-D transpose of a grouped-query attention's keys as ten operations (28,680 cycles against 1,600) but
  an image's [3, 50176] far slower than its [1, 3, 224, 224]: measured, not assumed.
- ``block_swap``: RESHAPE to ``[1, outer, X, Y]``, swap the last two dims, RESHAPE back. Ethos-U55
  moves the data in half the cycles (NCHW -> NHWC of a 3x224x224 image: 56 k instead of 113 k).
- ``elementwise_swap``: the same swap written by an elementwise op, MUL by one then a unit RESCALE
  (exact for every int8/int16 value). Ethos-U85 fuses the swap into the elementwise op's output,
  which streams at full rate where its TRANSPOSE works in 16-channel micro-blocks (37 k instead
  of 549 k cycles for the same image).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from .tosa_graph import NUMPY_OF, DType, Op, TosaGraph, make_attr

FORMS = ("transpose", "reduced", "block_swap", "elementwise_swap")
SWAPPABLE = (DType.INT8, DType.INT16)  # the dtypes an exact MUL-by-one carries


@dataclass(frozen=True)
class TransposeCase:
    """A TRANSPOSE of a ``shape`` tensor by ``perms``; ``blocks`` = (outer, X, Y) when it is a block swap."""

    shape: tuple[int, ...]
    perms: tuple[int, ...]
    dtype: object
    blocks: tuple[int, int, int] | None

    @property
    def out_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[p] for p in self.perms)

    @property
    def forms(self) -> tuple[str, ...]:
        """The forms that apply: ``reduced`` where dims drop or merge, the block forms for a block swap (the
        elementwise one for int8/int16)."""
        low = reduced(self.shape, self.perms)[0] != self.shape
        blocks = () if self.blocks is None else FORMS[2:] if self.dtype in SWAPPABLE else FORMS[2:3]
        return ("transpose",) + (("reduced",) if low else ()) + blocks

    def candidate(self, form: str) -> bytes:
        """A TOSA graph of just this TRANSPOSE in ``form``, for a backend to measure."""
        g = TosaGraph()
        g.output(emit_transpose(g, g.input(self.shape, self.dtype), self, form))
        return g.serialize()


def transpose_case(shape, perms, dtype) -> TransposeCase:
    """Describe a TRANSPOSE, finding the block swap it is (if any) once size-1 dims are dropped."""
    shape, perms = tuple(int(s) for s in shape), tuple(int(p) for p in perms)
    kept = [p for p in perms if shape[p] != 1]  # input dims in output order, unit dims dropped
    k = next((i for i, d in enumerate(kept) if d != sorted(kept)[i]), len(kept))  # the prefix left in place
    rest = kept[k:]  # a block swap leaves [b..., a...] here, every a below every b
    split = next((i for i in range(1, len(rest)) if rest[i] < rest[0]), None)
    blocks = None
    if split is not None and rest == sorted(rest[:split]) + sorted(rest[split:]) and max(rest[split:]) < rest[0]:
        blocks = (_size(shape, kept[:k]), _size(shape, rest[split:]), _size(shape, rest[:split]))
    return TransposeCase(shape, perms, dtype, blocks)


def _size(shape, dims) -> int:
    return math.prod(shape[d] for d in dims)


def reduced(shape, perms) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The same data movement at its lowest rank: size-1 dims dropped, dims that stay neighbours merged (a 5-D
    [1, 1, 32, 2, 16] by (0, 3, 1, 2, 4) is [32, 2, 16] by (1, 0, 2); Vela splits the first into many operations)."""
    kept = [d for d in range(len(shape)) if shape[d] != 1]
    at = {d: i for i, d in enumerate(kept)}
    groups: list[list[int]] = []  # runs of input dims, in output order
    for d in (p for p in perms if shape[p] != 1):
        if groups and at[d] == at[groups[-1][-1]] + 1:
            groups[-1].append(d)
        else:
            groups.append([d])
    by_input = sorted(range(len(groups)), key=lambda g: groups[g][0])
    return (tuple(_size(shape, groups[g]) for g in by_input),
            tuple(by_input.index(g) for g in range(len(groups))))


def reshape(g: TosaGraph, x: str, shape, location: str | None = None) -> str:
    """RESHAPE ``x`` to ``shape``, or ``x`` itself when it has that shape already."""
    info = g.info[x]
    if tuple(info.shape) == tuple(shape):
        return x
    return g.op(Op.RESHAPE, [x, g.shape_const(shape)], list(shape), info.dtype, make_attr("ReshapeAttribute"), location)


def emit_transpose(g: TosaGraph, x: str, case: TransposeCase, form: str, location: str | None = None,
                   out_shape=None) -> str:
    """Add ``case`` to ``g`` in ``form``, reading ``x`` (any shape holding the same bytes as ``case.shape``)
    and giving ``out_shape`` (default ``case.out_shape``); returns the output tensor's name."""
    if form not in case.forms:
        raise ValueError(f"form {form!r} does not apply to {case}")
    dtype = case.dtype
    if form in FORMS[:2]:
        shape, perms = reduced(case.shape, case.perms) if form == "reduced" else (case.shape, case.perms)
        if perms != tuple(range(len(perms))):
            x = g.op(Op.TRANSPOSE, [reshape(g, x, shape, location)], [shape[p] for p in perms], dtype,
                     make_attr("TransposeAttribute", list(perms)), location)
        return reshape(g, x, out_shape or case.out_shape, location)
    outer, rows, cols = case.blocks
    blocked = [1, outer, rows, cols]
    x = reshape(g, x, blocked, location)
    if form == "elementwise_swap":
        one = g.const(np.ones([1] * 4, dtype=NUMPY_OF[dtype]), dtype)
        product = g.op(Op.MUL, [x, one, g.const(np.zeros(1), DType.INT8)], blocked, DType.INT32,
                       make_attr("MulAttribute"), location)
        x = g.rescale(product, 1.0, dtype, location=location)
    swapped = [1, outer, cols, rows]
    x = g.op(Op.TRANSPOSE, [x], swapped, dtype, make_attr("TransposeAttribute", [0, 1, 3, 2]), location)
    return reshape(g, x, out_shape or case.out_shape, location)


class Case(Protocol):
    """A lowering choice: its equivalent forms, and a TOSA graph of each to measure."""

    @property
    def forms(self) -> tuple[str, ...]: ...

    def candidate(self, form: str) -> bytes: ...


ChooseForm = Callable[[Case], str]
