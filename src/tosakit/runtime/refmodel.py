"""The TOSA reference model: in this process for graphs tosakit just built, or — for graphs read from a
file — in a child process whose crash, runaway memory or hang cannot take the user's process with it.

The child (``python -m tosakit.runtime.refmodel``) imports numpy and the reference model only; requests and
replies are .npz files (never pickles) behind an 8-byte length, over its stdin and stdout."""

from __future__ import annotations

import io
import os
import resource
import select
import signal
import struct
import subprocess
import sys
import time

import numpy as np

from ..errors import TosakitError
from ..native import captured_output

_LENGTH = struct.Struct("<Q")


def run_tosa(tosa: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Run a TOSA flatbuffer on ``tosa_reference_model`` in this process; the outputs in graph order."""
    import tosa_reference_model as trm

    inputs = [np.ascontiguousarray(np.asarray(x)) for x in inputs]
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
    """A child process running TOSA graphs, with an address-space limit and a deadline per call."""

    def __init__(self, max_memory: int, deadline: float):
        self.max_memory, self.deadline = max_memory, deadline
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "tosakit.runtime.refmodel", str(max_memory)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)

    def run(self, tosa: bytes, inputs: list[np.ndarray], what: str) -> list[np.ndarray]:
        request = {"tosa": np.frombuffer(tosa, dtype=np.uint8)}
        request.update({f"in{k}": np.ascontiguousarray(x) for k, x in enumerate(inputs)})
        try:
            self.proc.stdin.write(_pack(request))
            self.proc.stdin.flush()
            header = self._read(_LENGTH.size, what)
            reply = _unpack(self._read(_LENGTH.unpack(header)[0], what))
        except (BrokenPipeError, EOFError):
            raise self._died(what) from None
        if "error" in reply:
            raise TosakitError(f"{what}: {reply['error'].item()}", "the delegate's TOSA does not fit its inputs: "
                               "re-export the program")
        return [reply[f"out{k}"] for k in range(len(reply))]

    def _read(self, n: int, what: str) -> bytes:
        out = bytearray()
        while len(out) < n:
            left = self.deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                self.close()
                raise TosakitError(f"{what}: the TOSA reference model did not finish within the time limit",
                                   "raise it (tosakit run --timeout) if the graph is that large")
            chunk = os.read(self.proc.stdout.fileno(), min(n - len(out), 1 << 20))
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    def _died(self, what: str) -> TosakitError:
        code = self.proc.wait()
        cause = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        return TosakitError(f"{what}: the TOSA reference model stopped ({cause}) on this delegate's graph, which "
                            f"passed tosakit's checks; the {self.max_memory}-byte memory limit may be too small",
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


def _serve(max_memory: int) -> None:
    """The child: run each request, reply with its outputs or its error."""
    import tosa_reference_model  # noqa: F401  (loaded before the address space is capped)

    if os.path.exists("/proc/self/statm"):  # Linux: cap the address space at what is mapped now + the limit
        soft = _vm_bytes() + max_memory
        resource.setrlimit(resource.RLIMIT_AS, (soft, soft))
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while header := stdin.read(_LENGTH.size):
        request = _unpack(stdin.read(_LENGTH.unpack(header)[0]))
        inputs = [request[f"in{k}"] for k in range(len(request) - 1)]
        try:
            reply = {f"out{k}": o for k, o in enumerate(run_tosa(request["tosa"].tobytes(), inputs))}
        except TosakitError as exc:
            reply = {"error": np.array(exc.message)}
        except MemoryError:
            reply = {"error": np.array("the graph needs more memory than the limit allows")}
        stdout.write(_pack(reply))
        stdout.flush()


def _vm_bytes() -> int:
    """This process's current address-space size."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * resource.getpagesize()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
