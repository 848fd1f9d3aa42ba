"""The .pte writer and reader: round trips, byte layout, corrupt files, and the ExecuTorch runtime."""

from __future__ import annotations

import random
import re
import struct
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from support.shared import made_once, run_folder
from tosakit.errors import TosakitError
from tosakit.program import schema as S
from tosakit.program.pte import constant_segment_bytes, deserialize_pte, serialize_pte
from tosakit.specs import CompileSpec

FLOAT = S.ScalarType.FLOAT


def planned(sizes, offset, dtype=FLOAT) -> S.EValue:
    """A memory-planned tensor in arena 1."""
    return S.EValue(S.Tensor(dtype, sizes=list(sizes), dim_order=list(range(len(sizes))),
                             allocation_info=S.AllocationDetails(1, offset)))


def constant(sizes, index, dtype=FLOAT) -> S.EValue:
    return S.EValue(S.Tensor(dtype, sizes=list(sizes), dim_order=list(range(len(sizes))), data_buffer_idx=index))


def rich_program() -> tuple[S.Program, list[bytes]]:
    """A program touching every value kind, instruction kind and Program field."""
    weights, offsets = constant_segment_bytes([b"\x01" * 24, b"\x02" * 5])
    values = [
        planned([2, 3], 0),
        constant([2, 3], 1),
        constant([5], 2, S.ScalarType.CHAR),
        S.EValue(S.Tensor(S.ScalarType.LONG, sizes=[1], dim_order=[0], requires_grad=True,
                          allocation_info=S.AllocationDetails(1, 7, 1), layout=0,
                          shape_dynamism=S.TensorShapeDynamism.DYNAMIC_BOUND,
                          extra_tensor_info=S.ExtraTensorInfo(3, "mod.w", S.TensorDataLocation.EXTERNAL,
                                                              S.DeviceType.CUDA, 1))),
        S.EValue(S.Tensor(S.ScalarType.BOOL, sizes=[4], dim_order=[0])),
        S.EValue(S.Null()),
        S.EValue(S.Int(-(2**40))),
        S.EValue(S.Bool(True)),
        S.EValue(S.Double(0.125)),
        S.EValue(S.String("héllo")),
        S.EValue(S.IntList([1, -2, 2**50])),
        S.EValue(S.DoubleList([1.5, -0.0])),
        S.EValue(S.BoolList([True, False, True])),
        S.EValue(S.TensorList([0, 1])),
        S.EValue(S.OptionalTensorList([0, 5])),
    ]
    instructions = [
        S.Instruction(S.KernelCall(0, [0, 1, 6, 0, 0])),
        S.Instruction(S.DelegateCall(0, [0, 4])),
        S.Instruction(S.MoveCall(0, 3)),
        S.Instruction(S.JumpFalseCall(7, 0)),
        S.Instruction(S.FreeCall(3)),
    ]
    frames = [S.FrameList([S.Frame("m.py", 12, "forward", "x + y")]) for _ in instructions]
    plan = S.ExecutionPlan(
        name="forward",
        container_meta_type=S.ContainerMetadata("[1, in]", "[1, out]"),
        values=values,
        inputs=[0],
        outputs=[4],
        chains=[S.Chain([0], [4], instructions, frames)],
        operators=[S.Operator("aten::add", "out")],
        delegates=[
            S.BackendDelegate("EthosUBackend", S.BackendDelegateDataReference(S.DataLocation.INLINE, 1),
                              [CompileSpec("target", b"ethos-u55-128"), CompileSpec("empty", b"")]),
            S.BackendDelegate("VgfBackend", S.BackendDelegateDataReference(S.DataLocation.SEGMENT, 2), []),
        ],
        non_const_buffer_sizes=[0, 4096, 2**33],
        non_const_buffer_device=[S.NonConstBufferDevice(1, S.DeviceType.CPU, 0)],
    )
    program = S.Program(
        execution_plan=[plan, S.ExecutionPlan("second")],
        backend_delegate_data=[S.BackendDelegateInlineData(b"abc"), S.BackendDelegateInlineData(b"PAYLOAD!" * 9)],
        constant_segment=S.SubsegmentOffsets(0, offsets),
        mutable_data_segments=[S.SubsegmentOffsets(3, [0, 0])],
        named_data=[S.NamedData("tosa/0", 1), S.NamedData("tosa/0-alias", 1)],
    )
    return program, [weights, b"named-blob", b"\xff" * 300, b"\x07" * 8]


def u32(data: bytes, pos: int) -> int:
    return struct.unpack_from("<I", data, pos)[0]


def header(data: bytes) -> tuple:
    """(magic, length, program_size, segment_base_offset, segment_data_size) of the extended header."""
    return struct.unpack_from("<4sIQQQ", data, 8)


# ------------------------------------------------------------------ round trips and layout


def test_rich_program_round_trips():
    program, segments = rich_program()
    read, read_segments = deserialize_pte(serialize_pte(program, segments))
    assert read_segments == segments
    assert read.segments == [S.DataSegment(0, 48), S.DataSegment(128, 10), S.DataSegment(256, 300),
                             S.DataSegment(640, 8)]
    assert read == replace(program, segments=read.segments)
    tensor = read.execution_plan[0].values[3].val
    assert tensor.scalar_type is S.ScalarType.LONG and tensor.extra_tensor_info.device_type is S.DeviceType.CUDA


def test_serialize_recomputes_segments_and_leaves_the_program_alone():
    program, segments = rich_program()
    program.segments = [S.DataSegment(999, 1)]
    read, _ = deserialize_pte(serialize_pte(program, segments))
    assert [s.size for s in read.segments] == [len(s) for s in segments]
    assert program.segments == [S.DataSegment(999, 1)]


def test_extended_header_and_segment_layout():
    program, segments = rich_program()
    data = serialize_pte(program, segments)
    assert data[4:8] == b"ET12"
    magic, length, program_size, base, data_size = header(data)
    assert (magic, length) == (b"eh00", 32)
    assert base == -(-program_size // 128) * 128 and data[program_size:base] == bytes(base - program_size)
    assert base + data_size == len(data)
    assert 40 <= u32(data, 0) < program_size  # root offset shifted past the header
    read, _ = deserialize_pte(data)
    for seg, payload in zip(read.segments, segments):
        start = base + seg.offset
        assert start % 128 == 0
        assert data[start : start + seg.size] == payload
        padded = -(-seg.size // 128) * 128
        assert data[start + seg.size : start + padded] == bytes(padded - seg.size)


def test_inline_delegate_data_and_buffers_are_16_byte_aligned():
    payloads = [b"D" * n for n in (1, 3, 17, 40)]
    storages = [b"S" * n for n in (5, 33)]
    program = S.Program(
        execution_plan=[S.ExecutionPlan("forward")],
        backend_delegate_data=[S.BackendDelegateInlineData(p) for p in payloads],
        constant_buffer=[S.Buffer(s) for s in storages],
    )
    for segments in ([], [b"x" * 5]):
        data = serialize_pte(program, segments)
        for blob in payloads + storages:
            # each vector is its u32 length followed by its bytes; the bytes start on a 16-byte boundary
            at = data.find(struct.pack("<I", len(blob)) + blob) + 4
            assert at > 4 and at % 16 == 0, (len(blob), at)


def test_no_constants_writes_the_empty_constant_segment_and_no_header():
    plan = S.ExecutionPlan("forward", values=[planned([4], 0)], inputs=[0], outputs=[0])
    data = serialize_pte(S.Program(execution_plan=[plan]), [])
    assert data[8:12] != b"eh00"
    read, segments = deserialize_pte(data)
    assert read.segments == [S.DataSegment(0, 0)] and segments == [b""]
    assert read.constant_segment == S.SubsegmentOffsets(0, [0])
    assert read.execution_plan[0].non_const_buffer_sizes == [0]


def test_constant_segment_bytes_pads_to_16_and_reserves_offset_0():
    data, offsets = constant_segment_bytes([b"a" * 3, b"b" * 16, b"", b"c" * 17])
    assert offsets == [0, 0, 16, 32, 32]
    assert len(data) == 64
    assert data[:16] == b"aaa" + bytes(13) and data[32:49] == b"c" * 17
    assert constant_segment_bytes([]) == (b"", [0])


def test_serialize_refuses_dangling_references():
    program, segments = rich_program()
    with pytest.raises(TosakitError, match=r"mutable_data_segments\[0\] refers to segment 3, but there are only 3 segments"):
        serialize_pte(program, segments[:3])
    with pytest.raises(TosakitError, match="delegate 'VgfBackend' refers to segment 2, but there are only 2 segments"):
        serialize_pte(replace(program, mutable_data_segments=None), segments[:2])
    bad_inline = replace(program, backend_delegate_data=[])
    with pytest.raises(TosakitError, match="uses inline data 1, but the program has 0 backend_delegate_data"):
        serialize_pte(bad_inline, segments)
    with pytest.raises(TosakitError, match="EValue.val cannot hold a Operator"):
        serialize_pte(S.Program(execution_plan=[S.ExecutionPlan("f", values=[S.EValue(S.Operator("x"))])]), [])


def test_torch_dtype_mapping():
    assert S.scalar_type_of(torch.float32) is S.ScalarType.FLOAT
    assert S.scalar_type_of(torch.int8) is S.ScalarType.CHAR
    assert S.scalar_type_of(torch.uint8) is S.ScalarType.BYTE
    assert S.torch_dtype_of(S.ScalarType.UINT16) is torch.uint16
    assert all(S.scalar_type_of(S.torch_dtype_of(st)) is st for st in S.ScalarType)
    with pytest.raises(TosakitError, match="complex64 has no ExecuTorch scalar type"):
        S.scalar_type_of(torch.complex64)
    with pytest.raises(TosakitError, match="unknown ExecuTorch scalar type 8"):
        S.torch_dtype_of(8)


# ------------------------------------------------------------------ damaged files


def _patched(data: bytes, pos: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, pos, value)
    return bytes(out)


def _damaged():
    program, segments = rich_program()
    good = serialize_pte(program, segments)
    _, _, program_size, base, _ = header(good)
    no_header = serialize_pte(S.Program(execution_plan=[S.ExecutionPlan("forward")]), [])
    bad_type = S.ExecutionPlan("f", values=[S.EValue(S.Tensor(99, sizes=[1], dim_order=[0]))])
    return {
        "identifier": (_patched(good, 4, "4s", b"XXXX"), r"not a \.pte: file identifier is b'XXXX', expected b'ET12'"),
        "tiny": (good[:6], "truncated: a .pte needs at least 8 bytes, the file has 6"),
        "segment": (good[:-200], rf"truncated: segment 3 ends at byte {base + 640 + 8} but the file has {len(good) - 200}"),
        "padding": (good[:-50], rf"truncated: the segment data ends at byte {len(good)} but the file has {len(good) - 50}"),
        "program": (good[:program_size - 9], f"truncated: the program ends at byte {program_size}"),
        "no_header_cut": (no_header[:-40], r"corrupt \.pte: .* outside the"),
        "root": (_patched(good, 0, "<I", 0xFFFFFF00), r"corrupt \.pte: root offset points to byte"),
        "header_length": (_patched(good, 12, "<I", 8), r"corrupt \.pte: extended header length is 8, expected at least 32"),
        "header_base": (_patched(good, 24, "<Q", 16), r"corrupt \.pte: extended header has program_size"),
        "scalar_type": (serialize_pte(S.Program(execution_plan=[bad_type]), []),
                        r"corrupt \.pte: Tensor.scalar_type is 99, not a valid ScalarType"),
    }


@pytest.mark.parametrize("case", list(_damaged()))
def test_damaged_file_names_the_problem(case):
    data, message = _damaged()[case]
    with pytest.raises(TosakitError, match=message):
        deserialize_pte(data)


def test_random_damage_only_ever_raises_tosakit_errors():
    program, segments = rich_program()
    good = serialize_pte(program, segments)
    rng = random.Random(0)
    damaged = [good[:n] for n in range(0, len(good), 7)]
    for _ in range(400):
        out = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            out[rng.randrange(len(out))] = rng.randrange(256)
        damaged.append(bytes(out))
    refused = 0
    for data in damaged:
        try:
            deserialize_pte(data)
        except TosakitError:
            refused += 1
    assert refused > len(damaged) // 3  # most damage is noticed; none escapes as another exception


# ------------------------------------------------------------------ the real ExecuTorch runtime


_FBS_SCALARS = {"?": "bool", "B": "ubyte", "b": "byte", "i": "int", "I": "uint", "q": "long", "Q": "ulong", "d": "double"}
_FBS_ALIASES = {"int64": "long", "uint64": "ulong", "uint32": "uint", "int32": "int", "uint8": "ubyte", "int8": "byte"}


def _fbs_type(kind) -> str:
    """How program.fbs spells the type of a field of this kind."""
    if kind == S.STR:
        return "string"
    if isinstance(kind, S.Scalar):
        return kind.as_enum.__name__ if kind.as_enum else _FBS_SCALARS[kind.fmt]
    if isinstance(kind, S.Vector):
        return f"[{_fbs_type(kind.of)}]" + (f" align {kind.align}" if kind.align else "")
    if isinstance(kind, S.Union):
        return "|".join(m.__name__ for m in kind.members)
    return kind.__name__


@pytest.fixture
def executorch_schema(et_oracle) -> Path:
    """The schema folder of the ExecuTorch package inside the oracle venv."""
    venv = Path(et_oracle.python).parent.parent
    found = sorted(venv.glob("lib/python3*/site-packages/executorch/schema/program.fbs"))
    assert found, f"no executorch/schema/program.fbs in {venv}"
    return found[0].parent


@pytest.mark.oracle
def test_tables_follow_program_fbs(executorch_schema):
    text = re.sub(r"//.*", "", (executorch_schema / "program.fbs").read_text())
    unions = {name: "|".join(re.findall(r"\w+", body)) for name, body in re.findall(r"union (\w+)\s*\{(.*?)\}", text, re.S)}
    tables = re.findall(r"table (\w+)\s*\{(.*?)\}", text, re.S)
    assert len(tables) == 36 and len(unions) == 2
    field = re.compile(r"(\w+)\s*:\s*([\w\[\]]+)\s*(?:\(force_align:\s*(\d+)\))?")
    spelled = lambda t: re.sub(r"\w+", lambda m: unions.get(m[0]) or _FBS_ALIASES.get(m[0], m[0]), t)  # noqa: E731
    for name, body in tables:
        expected = [(f, spelled(t) + (f" align {align}" if align else "")) for f, t, align in field.findall(body)]
        assert [(row[0], _fbs_type(row[2])) for row in S.layout(getattr(S, name))] == expected, name
    scalar = re.sub(r"//.*", "", (executorch_schema / "scalar_type.fbs").read_text())
    assert dict(re.findall(r"(\w+) = (\d+)", scalar)) == {t.name: str(t.value) for t in S.ScalarType}


def _write(tmp_path: Path, program: S.Program, segments: list[bytes]) -> Path:
    path = tmp_path / "model.pte"
    path.write_bytes(serialize_pte(program, segments))
    return path


@pytest.mark.oracle
def test_runtime_runs_our_add(tmp_path, et_oracle):
    plan = S.ExecutionPlan(
        name="forward",
        values=[planned([2, 3], 0), planned([2, 3], 32), S.EValue(S.Int(1)), planned([2, 3], 64)],
        inputs=[0, 1],
        outputs=[3],
        chains=[S.Chain([0, 1], [3], [S.Instruction(S.KernelCall(0, [0, 1, 2, 3, 3]))])],
        operators=[S.Operator("aten::add", "out")],
        non_const_buffer_sizes=[0, 96],
    )
    path = _write(tmp_path, S.Program(execution_plan=[plan]), [])
    assert et_oracle.load(path, method="forward") == ["forward"]
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    (out,) = et_oracle.run(path, [x, y])
    np.testing.assert_allclose(out, (x + y).numpy(), rtol=1e-6)


@pytest.mark.oracle
def test_runtime_runs_our_constants(tmp_path, et_oracle):
    c1, c2 = torch.arange(6.0).reshape(2, 3), torch.tensor([2.0, -1.0, 0.5])
    segment, offsets = constant_segment_bytes([c1.numpy().tobytes(), c2.numpy().tobytes()])
    plan = S.ExecutionPlan(
        name="forward",
        values=[planned([2, 3], 0), constant([2, 3], 1), S.EValue(S.Int(1)), planned([2, 3], 32),
                constant([3], 2), planned([2, 3], 0)],
        inputs=[0],
        outputs=[5],
        chains=[S.Chain([0], [5], [S.Instruction(S.KernelCall(0, [0, 1, 2, 3, 3])),
                                   S.Instruction(S.KernelCall(1, [3, 4, 5, 5]))])],
        operators=[S.Operator("aten::add", "out"), S.Operator("aten::mul", "out")],
        non_const_buffer_sizes=[0, 64],
    )
    program = S.Program(execution_plan=[plan], constant_segment=S.SubsegmentOffsets(0, offsets))
    path = _write(tmp_path, program, [segment])
    assert path.read_bytes()[8:12] == b"eh00"
    x = torch.randn(2, 3)
    (out,) = et_oracle.run(path, [x])
    np.testing.assert_allclose(out, ((x + c1) * c2).numpy(), rtol=1e-6)


MODEL_WITH_CONSTANT = """
import torch

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.arange(6, dtype=torch.float32).reshape(2, 3) / 4)
        self.register_buffer("d", torch.tensor([1.0, -2.0, 3.0]))

    def forward(self, x, y):
        return torch.softmax(x + self.c, dim=-1) * y + self.d

model = Model()
example_inputs = (torch.randn(2, 3), torch.randn(2, 3))
"""


@pytest.fixture(scope="module")
def executorch_pte(et_oracle, tmp_path_factory) -> Path:
    """Made by ExecuTorch once per test run."""
    folder = made_once(run_folder(tmp_path_factory) / "made_by_executorch",
                       lambda folder: et_oracle.export(MODEL_WITH_CONSTANT, folder / "made_by_executorch.pte"))
    return folder / "made_by_executorch.pte"


def _reference(x, y):
    c, d = torch.arange(6.0).reshape(2, 3) / 4, torch.tensor([1.0, -2.0, 3.0])
    return torch.softmax(x + c, dim=-1) * y + d


@pytest.mark.oracle
def test_reader_reads_an_executorch_made_pte(executorch_pte):
    program, segments = deserialize_pte(executorch_pte.read_bytes())
    assert program.version == 0
    (plan,) = program.execution_plan
    assert plan.name == "forward"
    assert [(op.name, op.overload) for op in plan.operators] == [
        ("aten::add", "out"), ("aten::_softmax", "out"), ("aten::mul", "out")]
    assert plan.non_const_buffer_sizes[0] == 0 and plan.non_const_buffer_sizes[1] >= 3 * 24
    assert len(plan.inputs) == 2 and len(plan.outputs) == 1
    assert plan.container_meta_type.encoded_out_str.startswith("[1, ")

    constants = {v.val.data_buffer_idx: v.val for v in plan.values if isinstance(v.val, S.Tensor) and v.val.data_buffer_idx}
    assert sorted(constants) == [1, 2]
    offsets = program.constant_segment.offsets
    assert offsets == [0, 0, 32]
    data = segments[program.constant_segment.segment_index]
    c = np.frombuffer(data[offsets[1]:offsets[1] + 24], np.float32).reshape(2, 3)
    d = np.frombuffer(data[offsets[2]:offsets[2] + 12], np.float32)
    np.testing.assert_array_equal(c, np.arange(6, dtype=np.float32).reshape(2, 3) / 4)
    np.testing.assert_array_equal(d, [1.0, -2.0, 3.0])
    assert constants[2].sizes == [3] and constants[2].scalar_type is FLOAT


@pytest.mark.oracle
def test_executorch_program_rewritten_by_us_still_runs(executorch_pte, tmp_path, et_oracle):
    program, segments = deserialize_pte(executorch_pte.read_bytes())
    path = _write(tmp_path, program, segments)
    assert deserialize_pte(path.read_bytes()) == (program, segments)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    (out,) = et_oracle.run(path, [x, y])
    np.testing.assert_allclose(out, _reference(x, y).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.oracle
def test_runtime_refuses_what_our_reader_refuses(tmp_path, et_oracle):
    path = tmp_path / "bad.pte"
    path.write_bytes(_damaged()["identifier"][0])
    with pytest.raises(et_oracle.Failure, match="Program identifier 'XXXX' != expected 'ET12'"):
        et_oracle.load(path)
