"""ExecuTorch's BundledProgram (``.bpte``, identifier ``BP08``, schema version 2): a program with test suites per
method — inputs, and the outputs expected — that a runner checks on the device (``tosakit run FILE.bpte`` on the
host). The tables are ``bundled_program_schema.fbs``'s; the API keeps ExecuTorch's names (``MethodTestCase``,
``MethodTestSuite``, ``BundledProgram``, ``serialize_from_bundled_program_to_flatbuffer``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from ..errors import TosakitError
from .flatbuf import Reader, build, corrupt
from .schema import ELEMENT_TYPES, I32, STR, U8, U32, Bool, Double, Int, ScalarType, Union, Vector, enum8, fb

FILE_IDENTIFIER = b"BP08"
SCHEMA_VERSION = 2


@dataclass
class Tensor:
    """A bundled tensor: its bytes in storage order (``dim_order``)."""

    scalar_type: ScalarType = enum8(ScalarType)
    sizes: list[int] = fb(Vector(I32), factory=list)
    data: bytes = fb(Vector(U8, align=16, raw=True), b"")
    dim_order: list[int] = fb(Vector(U8), factory=list)


@dataclass
class Value:
    val: Tensor | Int | Bool | Double = fb(Union((Tensor, Int, Bool, Double)))


@dataclass
class BundledMethodTestCase:
    inputs: list[Value] = fb(Vector(Value), factory=list)
    expected_outputs: list[Value] = fb(Vector(Value), factory=list)


@dataclass
class BundledMethodTestSuite:
    method_name: str = fb(STR)
    test_cases: list[BundledMethodTestCase] = fb(Vector(BundledMethodTestCase), factory=list)


@dataclass
class BundledProgramTable:
    """The file's root table (``BundledProgram`` in the schema): the version, the suites, the ``.pte`` bytes."""

    version: int = fb(U32, SCHEMA_VERSION)
    method_test_suites: list[BundledMethodTestSuite] = fb(Vector(BundledMethodTestSuite), factory=list)
    program: bytes = fb(Vector(U8, align=32, raw=True), b"")


def is_bundled(data: bytes) -> bool:
    """Whether ``data`` holds a BundledProgram (its file identifier)."""
    return bytes(data[4:8]) == FILE_IDENTIFIER


def serialize_bundled(table: BundledProgramTable) -> bytes:
    """The ``.bpte`` bytes of ``table``."""
    return build(table, FILE_IDENTIFIER)


def deserialize_bundled(data: bytes) -> BundledProgramTable:
    """Read and check a ``.bpte``: the version, each bundled tensor's bytes against its sizes, type and order."""
    view = memoryview(bytes(data))
    if len(view) < 8 or not is_bundled(view):
        raise TosakitError(f"not a .bpte: file identifier is {bytes(view[4:8])!r}, expected {FILE_IDENTIFIER!r}",
                           "pass a BundledProgram file (.bpte), as `tosakit compile --bundleio` writes")
    reader = Reader(view, len(view), ".bpte")
    table = reader.table(BundledProgramTable, reader.follow(0, "root offset"))
    if table.version != SCHEMA_VERSION:
        raise corrupt(".bpte", f"schema version {table.version}; this reader knows version {SCHEMA_VERSION}")
    if not table.program:
        raise corrupt(".bpte", "it bundles no program")
    for suite in table.method_test_suites:
        for k, case in enumerate(suite.test_cases):
            for kind, values in (("input", case.inputs), ("expected output", case.expected_outputs)):
                for i, v in enumerate(values):
                    if isinstance(v.val, Tensor):
                        _check_tensor(v.val, f"method {suite.method_name!r}, test case {k}, {kind} {i}")
    return table


def _check_tensor(t: Tensor, where: str) -> None:
    if t.scalar_type not in ELEMENT_TYPES:
        raise corrupt(".bpte", f"{where} has element type {t.scalar_type!r}, which no kernel reads")
    if any(s < 0 for s in t.sizes) or (t.dim_order and sorted(t.dim_order) != list(range(len(t.sizes)))):
        raise corrupt(".bpte", f"{where} has sizes {t.sizes} and dim order {t.dim_order}")
    nbytes = math.prod(t.sizes) * ELEMENT_TYPES[t.scalar_type][1]
    if len(t.data) != nbytes:
        raise corrupt(".bpte", f"{where} holds {len(t.data)} bytes; sizes {t.sizes} of "
                               f"{ELEMENT_TYPES[t.scalar_type][0]} need {nbytes}")


# ------------------------------------------------------------------ ExecuTorch's API


@dataclass
class MethodTestCase:
    """One call of a method: its inputs (tensors, ints, floats, bools) and the outputs expected (tensors)."""

    inputs: Sequence
    expected_outputs: Sequence | None = None


@dataclass
class MethodTestSuite:
    """The test cases of one method."""

    method_name: str
    test_cases: Sequence[MethodTestCase]


class BundledProgram:
    """A program (an ``ExecutorchProgramManager``, or a ``.pte``'s path) with its test suites, sorted by method."""

    def __init__(self, executorch_program=None, method_test_suites: Sequence[MethodTestSuite] = (),
                 pte_file_path: str | None = None):
        if (executorch_program is None) == (pte_file_path is None):
            raise TosakitError("BundledProgram takes a program or a .pte path, exactly one of them",
                               "pass executorch_program=... or pte_file_path=...")
        self.executorch_program, self.pte_file_path = executorch_program, pte_file_path
        self.method_test_suites = sorted(method_test_suites, key=lambda s: s.method_name)

    def program_bytes(self) -> bytes:
        if self.executorch_program is not None:
            return bytes(self.executorch_program.buffer)
        with open(self.pte_file_path, "rb") as f:
            return f.read()

    def serialize_to_schema(self) -> BundledProgramTable:
        """The file's tables."""
        return BundledProgramTable(SCHEMA_VERSION, [
            BundledMethodTestSuite(s.method_name, [
                BundledMethodTestCase([_value(x) for x in case.inputs],
                                      [_value(x) for x in case.expected_outputs or ()])
                for case in s.test_cases])
            for s in self.method_test_suites], self.program_bytes())


def serialize_from_bundled_program_to_flatbuffer(bundled_program: BundledProgram) -> bytes:
    """The ``.bpte`` bytes (ExecuTorch's name)."""
    return serialize_bundled(bundled_program.serialize_to_schema())


def deserialize_from_flatbuffer_to_bundled_program(data: bytes) -> BundledProgramTable:
    """The file's tables (ExecuTorch's name)."""
    return deserialize_bundled(data)


def _value(x) -> Value:
    """A test case's value: a torch tensor as its storage bytes and dim order, or a number."""
    if isinstance(x, bool):
        return Value(Bool(x))
    if isinstance(x, int):
        return Value(Int(x))
    if isinstance(x, float):
        return Value(Double(x))
    from .schema import scalar_type_of
    order = _dim_order(x)
    stored = x.detach().permute(order).contiguous()
    return Value(Tensor(scalar_type_of(x.dtype), list(x.shape), stored.numpy().tobytes(), order))


def _dim_order(x) -> list[int]:
    """The order a tensor's dimensions are stored in (outermost first): its strides, largest first."""
    return sorted(range(x.dim()), key=lambda d: (-x.stride(d), d))
