"""Vela's operation map: each NPU operation of a delegate paired with the TOSA tensor it writes, from Vela's own
records of compiling the delegate's TOSA again (``vela.compile_records``)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..backends.ethosu.vela import compile_records


@dataclass(frozen=True)
class NpuOperation:
    """One operation of Vela's high-level command stream: the command-stream bytes [offset, end) that run it,
    the TOSA tensor it writes (name, NHWC shape) and the box of that tensor it writes ([start, end) per axis),
    and the TOSA operator it was made from (its index in the block, its name)."""

    offset: int
    end: int
    vela_op: str
    ofm: str
    ofm_shape: tuple[int, ...]
    area: tuple[tuple[int, ...], tuple[int, ...]]
    tosa_index: int
    tosa_op: str


@dataclass(frozen=True)
class OperationMap:
    """Each NPU operation of a delegate with what it computes, or ``why`` no exact map exists."""

    operations: list[NpuOperation]
    why: str | None = None


_HL_OP = re.compile(r"^(\d+) (\w+) , subOps:\[([^\]]*)\]")
_HL_OFM = re.compile(r"^\s+OFM: ([^,]+), \[([\d, ]+)\]")
_HL_COMMAND = re.compile(r"^(\d+) (\w+) OFM area \[([\d, ]+) - ([\d, ]+)\]")
FUSED = ("-", "LUT", "Transpose", "Reverse")  # sub-operations that are part of their operation (its activation,
# the order it writes its OFM in); the others are operations chained after it
SAME_VALUES = ("_propagated_reshape", "_copy")  # suffixes of Vela's tensors that hold a TOSA tensor's values
DMA_OPS = ("Gather", "Scatter")  # run by the DMA on Ethos-U85: a DMA command, no operation in the database's queue


def _tosa_name(vela_name: str) -> str:
    """The TOSA tensor whose values a tensor of Vela's holds: Vela names a copy of one, or one it gave another
    shape, by suffixing its name."""
    for suffix in SAME_VALUES:
        vela_name = vela_name.removesuffix(suffix)
    return vela_name


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def _chain(sub_ops: list[str]) -> list[bool]:
    """Per operation of a high-level operation's chain (itself, then each sub-operation not ``FUSED``), whether a
    LUT follows it: the LUT sub-operations listed after an operation apply to its result."""
    luts = [False]
    for op in sub_ops:
        if op == "LUT":
            luts[-1] = True
        elif op not in FUSED:
            luts.append(False)
    return luts


def _listing(text: str) -> tuple[list, list]:
    """The high-level operations ([Vela op, OFM name, OFM shape, its chain]) and commands ((Vela op, box start,
    box end)) of Vela's listing. An Ethos-U85 operation's sub-operations other than those ``FUSED`` are operations
    chained after it: each has its own place in the stream, the last writes the OFM (``_chain``)."""
    ops, commands, section = [], [], None
    for line in text.splitlines():
        if line.startswith("High level NPU operations"):
            section = ops
        elif line.startswith("High level command stream"):
            section = commands
        elif section is ops and (m := _HL_OP.match(line)):
            ops.append([m.group(2), None, None, _chain(m.group(3).split())])
        elif section is ops and ops and ops[-1][1] is None and (m := _HL_OFM.match(line)):
            ops[-1][1:3] = [_tosa_name(m.group(1).strip()), _ints(m.group(2))]
        elif section is commands and (m := _HL_COMMAND.match(line)):
            commands.append((m.group(2), _ints(m.group(3)), _ints(m.group(4))))
    return ops, commands


def operation_map(tosa: bytes, flags: list[str], cmd_data: bytes) -> OperationMap:
    """Vela run again on ``tosa`` with the delegate's Vela ``flags``, printing its high-level command stream: each
    queue entry of its debug database (command-stream offset -> scheduled op, and optimised op -> source op =
    TOSA op index) paired with the high-level command at the same place (its OFM box) and the high-level
    operation of its scheduled op (its OFM tensor). Exact or nothing: the stream must be ``cmd_data`` byte for
    byte and every pairing must agree on the operator, else ``why`` says what did not."""
    records = compile_records(tosa, flags)
    if records.cmd_data != bytes(cmd_data):
        return OperationMap([], "Vela compiled the TOSA again into another command stream than the payload's")
    ops, commands = _listing(records.listing)
    queue = sorted(records.tables["queue"], key=lambda r: int(r["offset"]))
    optimised = {r["id"]: r for r in records.tables["optimised"]}
    sources = {r["id"]: r for r in records.tables["source"]}
    scheduled = list(dict.fromkeys(r["scheduled_id"] for r in queue))  # the queued operations, in order
    place: dict[str, tuple[list, bool, bool]] = {}  # scheduled op -> (its listing operation, chained, LUT after)
    for op in ops:
        chain = [] if op[0] in DMA_OPS else op[3]
        for k, lut in enumerate(chain):
            if len(place) >= len(scheduled):
                return OperationMap([], f"{len(scheduled)} scheduled operations are queued, the listing has more")
            place[scheduled[len(place)]] = (op, k < len(chain) - 1, lut)
    if len(place) != len(scheduled):
        return OperationMap([], f"{len(scheduled)} scheduled operations are queued, the listing has {len(place)}")
    written = [row for row in queue if not place[row["scheduled_id"]][1]]
    if len(written) != len(commands):
        return OperationMap([], f"Vela's database lists {len(written)} operations, its listing {len(commands)}")
    tosa_ops, chained_tensor = records.tosa_blocks[0], _chained_tensors(tosa)
    out, box = [], 0
    for k, row in enumerate(queue):
        (vela_op, ofm, shape, _), chained, lut = place[row["scheduled_id"]]
        name, start, end = commands[box]  # a chained operation computes the box of the operation it feeds
        box += not chained
        if name != vela_op or ofm is None:
            return OperationMap([], f"operation {k} at offset {int(row['offset']):#x} pairs {name} with {vela_op}")
        source = sources.get(optimised.get(row["optimised_id"], {}).get("source_id"), {})
        index = int(source.get("ext_key") or -1)
        if chained:
            ofm = chained_tensor(index, lut)
        stop = int(queue[k + 1]["offset"]) if k + 1 < len(queue) else len(cmd_data)
        out.append(NpuOperation(int(row["offset"]), stop, optimised.get(row["optimised_id"], {}).get("operator", name)
                                if chained else name, ofm, shape, (start, end), index,
                                tosa_ops[index] if 0 <= index < len(tosa_ops) else "?"))
    return OperationMap(out)


def _chained_tensors(tosa: bytes):
    """A function of an operator's index in the main block and whether a LUT follows it: the TOSA tensor the NPU
    operation made from it holds in its chain buffer. That is its output, taken on through the one RESCALE that
    reads it when it holds accumulators (Vela fuses an output rescale into its producer), then through the one
    TABLE that reads that (RESHAPEs between them move no values)."""
    from tosa.DType import DType
    from tosa.Op import Op
    from tosa.TosaGraph import TosaGraph

    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    operators = [block.Operators(i) for i in range(block.OperatorsLength())]
    readers: dict[str, list] = {}
    for op in operators:
        for j in range(op.InputsLength()):
            readers.setdefault(op.Inputs(j).decode(), []).append(op)

    wide = {block.Tensors(i).Name().decode() for i in range(block.TensorsLength())
            if block.Tensors(i).Type() in (DType.INT32, DType.INT48)}

    def through(name: str, op_type: int) -> str:
        """The output of the one ``op_type`` operator that reads ``name`` (through RESHAPEs), else ``name``."""
        found = name
        while len(after := readers.get(found, [])) == 1 and after[0].Op() in (op_type, Op.RESHAPE):
            found = after[0].Outputs(0).decode()
            if after[0].Op() == op_type:
                return found
        return name

    def tensor(index: int, lut: bool) -> str:
        if not 0 <= index < len(operators) or operators[index].OutputsLength() != 1:
            return "?"
        name = operators[index].Outputs(0).decode()
        name = through(name, Op.RESCALE) if name in wide else name
        return through(name, Op.TABLE) if lut else name
    return tensor
