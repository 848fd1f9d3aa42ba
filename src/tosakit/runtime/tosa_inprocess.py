"""TOSA on the reference model in this process: for graphs tosakit just built (a file's graphs run in the
sandbox, ``tosa_sandbox``, which calls this in its child). Imports numpy and the reference model only."""

from __future__ import annotations

import functools

import numpy as np

from ..errors import IndexRangeError, TosakitError
from ..native import captured_output


# Operators that pass an index tensor on unchanged in value (a GATHER's indices traced back through them).
_INDEX_VIEWS = ("RESHAPE", "IDENTITY", "TRANSPOSE", "TILE")
_INDEXED = ("GATHER", "SCATTER")  # operand 1 indexes the rows (dim 1) of operand 0


@functools.lru_cache(maxsize=16)  # read once per graph, not on every run of it (a decoder runs one per token)
def index_bounds(tosa: bytes) -> dict[int, int]:
    """The main block's inputs that a GATHER or SCATTER reads as indices (directly or through reshapes), by
    position: the number of rows it indexes (an index must lie in 0..rows-1)."""
    from tosa.Op import Op
    from tosa.TosaGraph import TosaGraph

    names = {value: name for name, value in vars(Op).items() if not name.startswith("_")}
    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    if not any(block.Operators(i).Op() in (Op.GATHER, Op.SCATTER) for i in range(block.OperatorsLength())):
        return {}  # most graphs: nothing more to read on every run
    shapes = {block.Tensors(i).Name().decode(): block.Tensors(i).ShapeAsNumpy() for i in range(block.TensorsLength())}
    made_by = {}
    for i in range(block.OperatorsLength()):
        op = block.Operators(i)
        for j in range(op.OutputsLength()):
            made_by[op.Outputs(j).decode()] = (names.get(op.Op()), [op.Inputs(k).decode() for k in range(op.InputsLength())])
    position = {block.Inputs(i).decode(): i for i in range(block.InputsLength())}
    bounds: dict[int, int] = {}
    for kind, operands in made_by.values():
        if kind not in _INDEXED or len(operands) < 2:
            continue
        source = operands[1]
        while source in made_by and made_by[source][0] in _INDEX_VIEWS:
            source = made_by[source][1][0]
        rows = shapes.get(operands[0])
        if source in position and rows is not None and len(rows) == 3:
            bounds[position[source]] = min(int(rows[1]), bounds.get(position[source], int(rows[1])))
    return bounds


def _check_indices(tosa: bytes, inputs: list[np.ndarray]) -> None:
    """Index inputs inside the rows they index (the reference model ends its process on one outside)."""
    for k, rows in index_bounds(tosa).items():
        if k < len(inputs) and inputs[k].size and not (0 <= inputs[k].min() and inputs[k].max() < rows):
            bad = inputs[k][(inputs[k] < 0) | (inputs[k] >= rows)].flat[0]
            raise IndexRangeError(f"input {k} holds index {bad}, outside 0..{rows - 1}, the rows the graph indexes "
                                  "(a token id past the vocabulary, a negative or too large position)",
                                  f"give input {k} values in 0..{rows - 1}", int(bad), rows - 1)


def run_tosa(tosa: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run a TOSA flatbuffer on ``tosa_reference_model`` in this process; the outputs in graph order."""
    import tosa_reference_model as trm

    inputs = [np.ascontiguousarray(np.asarray(x)) for x in inputs]
    _check_indices(tosa, inputs)
    with captured_output((1, 2)) as printed:
        try:
            outputs, status = trm.run(tosa, inputs)
        except ValueError as exc:
            outputs, status = None, exc
    if outputs is None or status != trm.GraphStatus.TOSA_VALID:
        detail = [ln for ln in printed[0].splitlines() if ln.strip() and "Different TOSA spec" not in ln]
        raise TosakitError(f"tosa_reference_model refused the graph: {status}; " + " | ".join(detail[-3:]),
                           "check the input shapes and dtypes against the delegate's inputs")
    return [np.asarray(o) for o in outputs]
