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
    chained: bool = False  # Ethos-U85: its result goes straight into the next operation, not to memory


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
DMA_OPS = ("Gather", "Scatter")  # run by the DMA on Ethos-U85: a DMA command, no operation in the database's queue


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def _listing(text: str) -> tuple[list, list]:
    """The high-level operations ([Vela op, OFM name, OFM shape, operations chained into it]) and commands
    ((Vela op, box start, box end)) of Vela's listing. An Ethos-U85 operation's sub-operations other than those
    ``FUSED`` are operations chained after it: each has its own place in the stream, the last writes the OFM."""
    ops, commands, section = [], [], None
    for line in text.splitlines():
        if line.startswith("High level NPU operations"):
            section = ops
        elif line.startswith("High level command stream"):
            section = commands
        elif section is ops and (m := _HL_OP.match(line)):
            ops.append([m.group(2), None, None, sum(s not in FUSED for s in m.group(3).split())])
        elif section is ops and ops and ops[-1][1] is None and (m := _HL_OFM.match(line)):
            ops[-1][1:3] = [m.group(1).strip(), _ints(m.group(2))]
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
    place: dict[str, tuple[list, bool]] = {}  # scheduled op -> (its listing operation, chained into the next)
    for op in ops:
        count = 0 if op[0] in DMA_OPS else 1 + op[3]
        for k in range(count):
            if len(place) >= len(scheduled):
                return OperationMap([], f"{len(scheduled)} scheduled operations are queued, the listing has more")
            place[scheduled[len(place)]] = (op, k < count - 1)
    if len(place) != len(scheduled):
        return OperationMap([], f"{len(scheduled)} scheduled operations are queued, the listing has {len(place)}")
    written = [row for row in queue if not place[row["scheduled_id"]][1]]
    if len(written) != len(commands):
        return OperationMap([], f"Vela's database lists {len(written)} operations, its listing {len(commands)}")
    tosa_ops = records.tosa_blocks[0]
    boxes = iter(commands)
    out = []
    for k, row in enumerate(queue):
        (vela_op, ofm, shape, _), chained = place[row["scheduled_id"]]
        name, start, end = (vela_op, (), ()) if chained else next(boxes)
        if name != vela_op or ofm is None:
            return OperationMap([], f"operation {k} at offset {int(row['offset']):#x} pairs {name} with {vela_op}")
        source = sources.get(optimised.get(row["optimised_id"], {}).get("source_id"), {})
        index = int(source.get("ext_key") or -1)
        stop = int(queue[k + 1]["offset"]) if k + 1 < len(queue) else len(cmd_data)
        out.append(NpuOperation(int(row["offset"]), stop, optimised.get(row["optimised_id"], {}).get("operator", name)
                                if chained else name, ofm, shape, (start, end), index,
                                tosa_ops[index] if 0 <= index < len(tosa_ops) else "?", chained))
    return OperationMap(out)
