"""The TOSA reference model: in this process for graphs tosakit just built, or — for graphs read from a
file — in a child process whose crash, runaway memory or hang cannot take the user's process with it. The
same child runs a file's Ethos-U payloads on the simulator, whose weight decoder (Vela's codec) is native
code too: it ends its process on some damaged streams.

The child (``python -m tosakit.runtime.refmodel``) imports numpy, the reference model and the simulator only;
requests and replies are .npz files (never pickles) behind an 8-byte length, over its stdin and stdout."""

from __future__ import annotations

import functools
import io
import json
import os
import signal
import struct
import subprocess
import sys

import numpy as np

from ..errors import TosakitError, first_line
from ..native import cap_address_space, captured_output, read_exact

_LENGTH = struct.Struct("<Q")


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
            raise TosakitError(f"input {k} holds index {bad}, outside 0..{rows - 1}, the rows the graph indexes "
                               "(a token id past the vocabulary, a negative or too large position)",
                               f"give input {k} values in 0..{rows - 1}")


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


def _pack(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return _LENGTH.pack(len(buf.getvalue())) + buf.getvalue()


def _unpack(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


class IsolatedReferenceModel:
    """A child process running TOSA graphs and Ethos-U payloads, with an address-space limit and a deadline."""

    def __init__(self, max_memory: int, deadline: float):
        self.max_memory, self.deadline = max_memory, deadline
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "tosakit.runtime.refmodel", str(max_memory)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)

    def run(self, tosa: bytes, inputs: list[np.ndarray], what: str) -> list[np.ndarray]:
        """``tosa`` on the reference model."""
        reply = self._call({"tosa": np.frombuffer(tosa, dtype=np.uint8)}, inputs, what, "the TOSA reference model")
        if "error" in reply:
            raise TosakitError(f"{what}: {reply['error'].item()}", reply["hint"].item() or "the delegate's TOSA does "
                               "not fit its inputs: re-export the program")
        return [reply[f"out{k}"] for k in range(len(reply))]

    def simulate(self, payload: bytes, inputs: list[np.ndarray], what: str) -> list[np.ndarray]:
        """An Ethos-U delegate ``payload`` (its bytes, checked by validation) on the simulator; its errors keep
        their kind (NpuAccessError, ...), a fault in the simulator itself is a RuntimeError."""
        from .ethosu.memory import NpuAccessError
        from .ethosu.npu import UnsupportedCommandError

        request = {"payload": np.frombuffer(payload, dtype=np.uint8), "deadline": np.array(self.deadline)}
        reply = self._call(request, inputs, what, "the Ethos-U simulator")
        if "bug" in reply:
            raise RuntimeError(f"{what}: the Ethos-U simulator failed: {reply['bug'].item()}")
        if "error" in reply:
            kind = {"NpuAccessError": NpuAccessError, "UnsupportedCommandError": UnsupportedCommandError}.get(
                reply["kind"].item(), TosakitError)
            raise kind(f"{what}: {reply['error'].item()}", reply["hint"].item() or None)
        return [reply[f"out{k}"] for k in range(len(reply))]

    def operations(self, payload: bytes, tosa: bytes, flags: list[str], inputs: list[np.ndarray],
                   what: str) -> list:
        """The delegate per NPU operation (``npu_ops.compare_payload``): Vela on its TOSA, the simulator and the
        reference model, all in this child."""
        from .npu_ops import NpuOpReport

        request = {"payload": np.frombuffer(payload, dtype=np.uint8), "tosa": np.frombuffer(tosa, dtype=np.uint8),
                   "flags": np.array(json.dumps(flags)), "name": np.array(what), "deadline": np.array(self.deadline)}
        reply = self._call(request, inputs, what, "the per-operation check")
        if "error" in reply or "bug" in reply:
            message = reply["error"].item() if "error" in reply else reply["bug"].item()
            raise TosakitError(f"{what}: the per-operation check failed: {message}", "report the program to tosakit")
        return [NpuOpReport(**row) for row in json.loads(reply["rows"].item())]

    def _call(self, request: dict, inputs: list[np.ndarray], what: str, engine: str) -> dict[str, np.ndarray]:
        request.update({f"in{k}": np.ascontiguousarray(x) for k, x in enumerate(inputs)})
        try:
            self.proc.stdin.write(_pack(request))
            self.proc.stdin.flush()
            header = self._read(_LENGTH.size, what, engine)
            return _unpack(self._read(_LENGTH.unpack(header)[0], what, engine))
        except (BrokenPipeError, EOFError):
            raise self._died(what, engine) from None

    def _read(self, n: int, what: str, engine: str) -> bytes:
        try:
            return read_exact(self.proc.stdout.fileno(), n, self.deadline)
        except TimeoutError:
            self.close()
            raise TosakitError(f"{what}: {engine} did not finish within the time limit",
                               "raise it (tosakit run --timeout) if the delegate is that large") from None

    def _died(self, what: str, engine: str) -> TosakitError:
        code = self.proc.wait()
        cause = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return TosakitError(f"{what}: {engine} stopped ({cause}) on this delegate, which passed tosakit's checks; "
                            f"the delegate may be damaged, or the {self.max_memory}-byte memory limit too small",
                            "raise --max-memory if you trust the file, else report it to tosakit")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:  # a full pipe to a dead child
                pass


def _simulate(request: dict[str, np.ndarray], inputs: list[np.ndarray]) -> list[np.ndarray]:
    from ..backends.ethosu.payload import parse_payload
    from .ethosu.simulate import simulate

    with captured_output((1, 2)):  # stdout is the reply pipe: nothing native may print to it
        return simulate(parse_payload(request["payload"].tobytes()), inputs,
                        deadline=float(request["deadline"])).outputs


def _operations(request: dict[str, np.ndarray], inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    from .npu_ops import compare_payload

    with captured_output((1, 2)):
        rows = compare_payload(request["name"].item(), request["tosa"].tobytes(), request["payload"].tobytes(),
                               json.loads(request["flags"].item()), inputs)
    return {"rows": np.array(json.dumps([vars(r) for r in rows]))}


def _reply(request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run one request: its outputs, or its error with the error's hint and kind; a fault of the simulator
    itself (not of its input) as ``bug``."""
    inputs = [request[f"in{k}"] for k in range(sum(key.startswith("in") for key in request))]
    try:
        if "flags" in request:
            return _operations(request, inputs)
        outputs = _simulate(request, inputs) if "payload" in request else run_tosa(request["tosa"].tobytes(), inputs)
    except TosakitError as exc:
        return _error(exc.message, exc.hint or "", type(exc).__name__)
    except MemoryError:
        return _error("the delegate needs more memory than the limit allows",
                      "raise the limit (tosakit run --max-memory) if you trust the file")
    except Exception as exc:  # noqa: BLE001
        if "payload" not in request:
            raise  # the reference model's own fault ends the child, as it always has: the parent reports that
        return {"bug": np.array(f"{type(exc).__name__}: {first_line(exc)}")}
    return {f"out{k}": o for k, o in enumerate(outputs)}


def _error(message: str, hint: str = "", kind: str = "TosakitError") -> dict[str, np.ndarray]:
    return {"error": np.array(message), "hint": np.array(hint), "kind": np.array(kind)}


def _serve(max_memory: int) -> None:
    """The child: run each request, reply with its outputs or its error."""
    import tosa_reference_model  # noqa: F401  (loaded before the address space is capped)

    from .ethosu.simulate import simulate  # noqa: F401

    cap_address_space(max_memory)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while header := stdin.read(_LENGTH.size):
        stdout.write(_pack(_reply(_unpack(stdin.read(_LENGTH.unpack(header)[0])))))
        stdout.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
