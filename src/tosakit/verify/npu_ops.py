"""Per NPU operation: what each Ethos-U operation wrote, simulated, against the TOSA tensor it computes.

Vela's own records say which tensor each operation writes (``operation_map``: its debug database and its
high-level command stream listing); the reference model runs the delegate's TOSA with every tensor made an
output (``with_outputs``); the simulator reports each operation's OFM as it is written. Every comparison is
exact: an operation is compared when its OFM, as its registers describe it, is the box Vela says it writes,
and is otherwise listed as not compared, with the reason."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..backends.ethosu.payload import EthosUPayload, parse_payload
from ..errors import TosakitError
from ..native import captured_output
from ..runtime.ethosu.commands import NotSimulatedError, decode
from ..runtime.ethosu.system import compile_flags
from ..runtime.ethosu.featuremap import FeatureMap
from ..runtime.ethosu.simulate import require_simulated, simulate
from ..runtime.records import NpuCall
from ..runtime.tosa_inprocess import run_tosa
from ..runtime.tosa_sandbox import IsolatedReferenceModel
from ..runtime.tosa_validate import check_tosa

if TYPE_CHECKING:  # Vela's compiler is imported only when an operation map is made
    from .operation_map import OperationMap

COMPUTE = ("NPU_OP_CONV", "NPU_OP_DEPTHWISE", "NPU_OP_POOL", "NPU_OP_ELEMENTWISE")
VELA_STEPS = {"_reducesum": "a reduction's sums of stored values, whose offset the next operation takes off",
              "/Transpose": "an operand transposed for the operation that reads it",
              "_transpose": "an operand transposed for the operation that reads it",
              "/AndNot": "a step of a SELECT made of bitwise operations",
              "/And": "a step of a SELECT made of bitwise operations"}  # suffixes Vela gives the tensors of its own steps, and what they hold
SUMS_NOTE = ("chained: its 32-bit sums go straight into the next operation, which takes Vela's offset off them "
             "(no TOSA tensor holds them; compared where the chain ends)")


@dataclass(frozen=True)
class NpuOpReport:
    """One NPU operation of a delegate against the TOSA tensor it computes."""

    delegate: str
    offset: int
    vela_op: str
    tosa_op: str  # "CONV2D #14": the TOSA operator Vela made it from, with its index in the block
    tensor: str  # the TOSA tensor it writes
    values: int  # values compared (0: not compared)
    differ: int
    max_diff: int
    note: str = ""  # why it was not compared

    def __str__(self) -> str:
        head = f"{self.delegate} {self.offset:#06x} {self.vela_op} ({self.tosa_op} -> {self.tensor})"
        if not self.values:
            return f"{head}: not compared: {self.note}"
        if not self.differ:
            return f"{head}: {self.values} values bit-exact"
        return f"{head}: {self.differ} of {self.values} values differ (max |diff| {self.max_diff})"


def with_outputs(tosa: bytes, names: list[str]) -> tuple[bytes, list[str]]:
    """The TOSA graph with tensors ``names`` of its main block appended to that block's outputs (a vector of
    strings written after the last byte, and the block's ``outputs`` field pointed at it: flatbuffer offsets
    point forward, so nothing else moves), and its outputs' names in order."""
    from tosa.TosaGraph import TosaGraph

    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    outputs_slot = 12  # TosaBasicBlock.outputs in tosa.fbs (name, operators, tensors, inputs, outputs)
    field = block._tab.Pos + block._tab.Offset(outputs_slot)
    old = [block.Outputs(j).decode() for j in range(block.OutputsLength())]
    every = old + [n for n in names if n not in old]
    buf = bytearray(tosa) + bytes(-len(tosa) % 4)
    vector = len(buf)
    buf += struct.pack("<I", len(every)) + bytes(4 * len(every))
    for j, name in enumerate(every):
        buf += bytes(-len(buf) % 4)
        slot = vector + 4 + 4 * j
        struct.pack_into("<I", buf, slot, len(buf) - slot)
        encoded = name.encode()
        buf += struct.pack("<I", len(encoded)) + encoded + b"\0"
    struct.pack_into("<I", buf, field, vector - field)
    return bytes(buf), every


def _tensor_names(tosa: bytes) -> list[str]:
    """Names of the tensors the main block's operators write."""
    from tosa.TosaGraph import TosaGraph

    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    names = []
    for i in range(block.OperatorsLength()):
        op = block.Operators(i)
        names += [op.Outputs(j).decode() for j in range(op.OutputsLength())]
    return names


def compare_delegate(name: str, module, args: tuple) -> list[NpuOpReport]:
    """An Ethos-U delegate (a LoweredBackendModule and the tensors it is called with) per NPU operation; nothing
    for other delegates or streams the simulator does not run."""
    if module.backend_id != "EthosUBackend":
        return []
    arrays = [x.detach().permute(tuple(order)).contiguous().reshape(-1).numpy()
              for x, order in zip(args, module.input_orders)]
    return compare_payload(name, module.tosa, module.processed_bytes, compile_flags(module.compile_specs), arrays)


def compare_payload(name: str, tosa: bytes, blob: bytes, flags: list[str], arrays: list[np.ndarray]) -> list[NpuOpReport]:
    """A delegate payload ``blob`` compiled by Vela with ``flags`` from ``tosa``, on its stored input ``arrays``,
    per NPU operation (nothing for a stream the simulator does not run)."""
    from .operation_map import operation_map

    payload = parse_payload(blob)
    try:
        require_simulated(decode(payload.cmd_data))
    except NotSimulatedError:
        return []
    return compare_operations(name, tosa, payload, operation_map(tosa, flags, payload.cmd_data), arrays)


def compare_operations(delegate: str, tosa: bytes, payload: EthosUPayload, mapping: OperationMap,
                       inputs: list[np.ndarray]) -> list[NpuOpReport]:
    """Simulate ``payload`` on ``inputs`` (the delegate's inputs as stored, one array each) and compare each NPU
    operation of ``mapping`` with the reference model's value of the tensor it writes."""
    if mapping.why is not None:
        return [NpuOpReport(delegate, 0, "-", "-", "-", 0, 0, 0, f"no exact map of operations: {mapping.why}")]
    graph_inputs = check_tosa(tosa, delegate, 1 << 31).inputs
    arrays = [x.reshape(t.shape) for x, t in zip(inputs, graph_inputs)]
    exposed, order = with_outputs(tosa, _tensor_names(tosa))
    tensors = {t.name: x for t, x in zip(graph_inputs, arrays)} | dict(zip(order, run_tosa(exposed, arrays)))
    written: dict[int, np.ndarray] = {}  # command offset -> the OFM it wrote

    def observe(npu, command) -> None:
        if command.register.name in COMPUTE:
            chained_sums = npu.ofm_chained() and FeatureMap.of(npu.regs, "OFM").bits == 32
            written[command.offset] = SUMS_NOTE if chained_sums else npu.stored_ofm()

    stopped = None
    try:
        simulate(payload, inputs, observe=observe)
    except TosakitError as exc:  # the operations before the fault are still compared
        stopped = exc.message
    reports = []
    for op in mapping.operations:
        ran = [off for off in written if op.offset <= off < op.end]
        note, got, want = "", None, None
        if stopped is not None and not ran:
            note = f"not run: the simulation stopped ({stopped})"
        elif op.ofm not in tensors:
            note = _vela_own(op.ofm)
        elif len(ran) != 1:
            note = f"Vela runs it as {len(ran)} NPU operations"
        elif isinstance(written[ran[0]], str):
            note = written[ran[0]]
        else:
            got, want, note = written[ran[0]], *_box(tensors[op.ofm], op)
            if want is not None and got.shape != want.shape:
                note = f"its OFM registers describe {list(got.shape)}, Vela's box {list(want.shape)}"
        tosa_op = f"{op.tosa_op} #{op.tosa_index}"
        if note:
            reports.append(NpuOpReport(delegate, op.offset, op.vela_op, tosa_op, op.ofm, 0, 0, 0, note))
            continue
        diff = np.abs(got.astype(np.int64) - want.astype(np.int64))
        reports.append(NpuOpReport(delegate, ran[0], op.vela_op, tosa_op, op.ofm, int(diff.size),
                                   int((diff > 0).sum()), int(diff.max(initial=0))))
    return reports


def compare_call(call: NpuCall) -> list[NpuOpReport]:
    """A delegate call of a program run (``LoadedProgram.run_and_check``) per NPU operation: Vela on its TOSA,
    the simulator and the reference model, in the run's sandbox for a file from anywhere."""
    flags = compile_flags(call.compile_specs)
    if call.sandbox is None:
        return compare_payload(call.name, call.tosa, call.payload, flags, call.inputs)
    return _in_sandbox(call.sandbox, call, flags)


def _in_sandbox(sandbox: IsolatedReferenceModel, call: NpuCall, flags: list[str]) -> list[NpuOpReport]:
    request = {"handler": np.array(f"{__name__}:serve_call"), "payload": np.frombuffer(call.payload, dtype=np.uint8),
               "tosa": np.frombuffer(call.tosa, dtype=np.uint8), "flags": np.array(json.dumps(flags)),
               "name": np.array(call.name), "deadline": np.array(sandbox.deadline)}
    reply = sandbox.call(request, call.inputs, call.name, "the per-operation check")
    if "error" in reply or "bug" in reply:
        message = reply["error"].item() if "error" in reply else reply["bug"].item()
        raise TosakitError(f"{call.name}: the per-operation check failed: {message}", "report the program to tosakit")
    return [NpuOpReport(**row) for row in json.loads(reply["rows"].item())]


def serve_call(request: dict[str, np.ndarray], inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The sandbox's handler of ``_in_sandbox``'s request, in the child."""
    with captured_output((1, 2)):
        rows = compare_payload(request["name"].item(), request["tosa"].tobytes(), request["payload"].tobytes(),
                               json.loads(request["flags"].item()), inputs)
    return {"rows": np.array(json.dumps([vars(r) for r in rows]))}


def _box(full: np.ndarray, op) -> tuple[np.ndarray | None, str]:
    """The part of TOSA tensor ``full`` that ``op`` writes, as [H, W, C]: Vela's box in its view of the tensor
    (``ofm_shape``, same elements), whose axes before the last three must have extent 1; or why not."""
    shape, (start, stop) = op.ofm_shape, op.area
    shape = (1,) * (len(start) - len(shape)) + tuple(shape)  # a box of more axes than the shape Vela lists
    if full.size != int(np.prod(shape)) or len(start) != len(shape) or len(shape) < 3:
        return None, f"its tensor {list(full.shape)} is not the {list(shape)} Vela writes"
    if any(b - a != 1 for a, b in zip(start[:-3], stop[:-3])):
        return None, f"Vela's box {list(start)}-{list(stop)} spans more than its last three axes"
    index = tuple(start[:-3]) + tuple(slice(a, b) for a, b in zip(start[-3:], stop[-3:]))
    return full.reshape(shape)[index], ""


def _vela_own(tensor: str) -> str:
    """Why an operation writing ``tensor``, which the TOSA does not compute, is not compared."""
    what = next((v for k, v in VELA_STEPS.items() if tensor.endswith(k)), "")
    if tensor.startswith("#"):  # a tensor Vela made and numbered itself
        what = "a step of an operator it runs as several operations"
    return f"it writes a tensor of Vela's own{f' ({what})' if what else ''}, which no TOSA tensor holds"


def summary(reports: list[NpuOpReport], shown: int = 4) -> list[str]:
    """How many NPU operations were compared and how they agree; then the first that differ, or were not
    run, and why the others were not compared."""
    compared = [r for r in reports if r.values]
    differing = [r for r in compared if r.differ]
    verdict = (f"{len(differing)} differ, the first at {differing[0].delegate} {differing[0].offset:#x}" if differing
               else "all bit-exact" if compared else "none could be compared, so none is shown bit-exact")
    lines = [f"NPU operations: {len(compared)} of {len(reports)} compared with the TOSA tensor each computes: {verdict}"]
    lines += [f"  {r}" for r in differing[:shown]]
    lines += [f"  {r}" for r in reports if not r.values][:shown]
    return lines
