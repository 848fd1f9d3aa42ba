"""The sandbox: a child process running the TOSA graphs and Ethos-U payloads of a file from anywhere, whose
crash, runaway memory or hang cannot take the user's process with it (the reference model and Vela's codec,
which the simulator's weight decoder calls, are native code: they end their process on some damaged input).

The child (``python -m tosakit.runtime.tosa_sandbox``) imports numpy, the reference model and the simulator
only; requests and replies are .npz files (never pickles) behind an 8-byte length, over its stdin and stdout.
A later stage hands the child more work by naming its own handler in the request (``handler``)."""

from __future__ import annotations

import importlib
import io
import os
import signal
import struct
import subprocess
import sys
import weakref
from typing import Callable

import numpy as np

from ..errors import RAISE_MEMORY_HINT, IndexRangeError, TosakitError, first_line
from ..native import cap_address_space, captured_output, read_exact
from .tosa_inprocess import run_tosa

LENGTH = struct.Struct("<Q")


def pack_message(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return LENGTH.pack(len(buf.getvalue())) + buf.getvalue()


def unpack_message(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


class Child:
    """A child process that answers length-prefixed .npz messages on its stdin and stdout, read with a deadline."""

    def __init__(self, argv: list[str], env: dict[str, str], deadline: float):
        self.deadline = deadline
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=env)
        # Ended with its owner (a program kept across runs): subprocess keeps a running child's Popen, pipes open,
        # so it never read the end of its input and stayed (197 children, 6.5 GB, in one test run).
        self._end = weakref.finalize(self, _end, self.proc)

    def exchange(self, request: dict[str, np.ndarray], what: str, engine: str) -> dict[str, np.ndarray]:
        """Send ``request``, return the reply; ``engine`` names the work in errors (its stop, its time limit)."""
        try:
            self.proc.stdin.write(pack_message(request))
            self.proc.stdin.flush()
            header = self._read(LENGTH.size, what, engine)
            return unpack_message(self._read(LENGTH.unpack(header)[0], what, engine))
        except (BrokenPipeError, EOFError):
            raise self._died(what, engine) from None

    def _read(self, n: int, what: str, engine: str) -> bytes:
        try:
            return read_exact(self.proc.stdout.fileno(), n, self.deadline)
        except TimeoutError:
            self.close()
            raise TosakitError(f"{what}: {engine} did not finish within the time limit",
                               "raise it (tosakit run --timeout) if the delegate is that large") from None

    def stopped(self) -> str:
        """How the child ended: "signal SIGSEGV" or "exit status 1"."""
        code = self.proc.wait()
        return f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"

    def _died(self, what: str, engine: str) -> TosakitError:
        return TosakitError(f"{what}: {engine} stopped ({self.stopped()}) on this delegate")

    def close(self) -> None:
        self._end()


def _end(proc: subprocess.Popen) -> None:
    """Kill ``proc`` if it runs, reap it and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    for stream in (proc.stdin, proc.stdout):
        try:
            stream.close()
        except OSError:  # a full pipe to a dead child
            pass


class IsolatedReferenceModel(Child):
    """A child process running TOSA graphs and Ethos-U payloads, with an address-space limit and a deadline."""

    def __init__(self, max_memory: int, deadline: float):
        self.max_memory = max_memory
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        super().__init__([sys.executable, "-m", "tosakit.runtime.tosa_sandbox", str(max_memory)], env, deadline)

    def run(self, tosa: bytes, inputs: list[np.ndarray], what: str) -> list[np.ndarray]:
        """``tosa`` on the reference model."""
        reply = self.call({"tosa": np.frombuffer(tosa, dtype=np.uint8)}, inputs, what, "the TOSA reference model")
        if "error" in reply:
            _raise_index_error(reply, what)
            raise TosakitError(f"{what}: {reply['error'].item()}", reply["hint"].item() or "the delegate's TOSA does "
                               "not fit its inputs: re-export the program")
        return [reply[f"out{k}"] for k in range(len(reply))]

    def simulate(self, payload: bytes, inputs: list[np.ndarray], what: str,
                 profile: list[str] | None = None) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        """An Ethos-U delegate ``payload`` (its bytes, checked by validation) on the simulator, timed with
        ``profile`` (its Vela flags) when given: its outputs and the profile's arrays (``NpuProfile.to_message``,
        empty without one). Its errors keep their kind (NpuAccessError, ...), a fault in the simulator itself is a
        RuntimeError."""
        from .ethosu.memory import NpuAccessError
        from .ethosu.npu import UnsupportedCommandError

        request = {"payload": np.frombuffer(payload, dtype=np.uint8), "deadline": np.array(self.deadline)}
        if profile is not None:
            request["profile"] = np.array(profile or [""])
        reply = self.call(request, inputs, what, "the Ethos-U simulator")
        if "bug" in reply:
            raise RuntimeError(f"{what}: the Ethos-U simulator failed: {reply['bug'].item()}")
        if "error" in reply:
            _raise_index_error(reply, what)
            kind = {"NpuAccessError": NpuAccessError, "UnsupportedCommandError": UnsupportedCommandError}.get(
                reply["kind"].item(), TosakitError)
            raise kind(f"{what}: {reply['error'].item()}", reply["hint"].item() or None)
        outputs = [reply[f"out{k}"] for k in range(sum(key.startswith("out") for key in reply))]
        return outputs, {k: v for k, v in reply.items() if k.startswith("profile_")}

    def call(self, request: dict, inputs: list[np.ndarray], what: str, engine: str) -> dict[str, np.ndarray]:
        """One request (``inputs`` added as in0, in1, ...) and its reply; ``engine`` names the work in errors."""
        request.update({f"in{k}": np.ascontiguousarray(x) for k, x in enumerate(inputs)})
        return self.exchange(request, what, engine)

    def _died(self, what: str, engine: str) -> TosakitError:
        return TosakitError(f"{what}: {engine} stopped ({self.stopped()}) on this delegate, which passed tosakit's "
                            f"checks; the delegate may be damaged, or the {self.max_memory}-byte memory limit too "
                            "small", "raise --max-memory if you trust the file, else report it to tosakit")


def _simulate(request: dict[str, np.ndarray], inputs: list[np.ndarray]) -> dict[str, np.ndarray]:
    from ..backends.ethosu.payload import parse_payload
    from .ethosu.simulate import simulate

    profile = [str(f) for f in request["profile"] if str(f)] if "profile" in request else None
    with captured_output((1, 2)):  # stdout is the reply pipe: nothing native may print to it
        run = simulate(parse_payload(request["payload"].tobytes()), inputs, deadline=float(request["deadline"]),
                       profile=profile)
    reply = {f"out{k}": o for k, o in enumerate(run.outputs)}
    return reply if run.profile is None else {**reply, **run.profile.to_message()}


def _handler(name: str) -> Callable[[dict[str, np.ndarray], list[np.ndarray]], dict[str, np.ndarray]]:
    """The handler a request names ("module:function" in tosakit's own stages), imported on its first use."""
    module, _, function = name.partition(":")
    if not module.startswith("tosakit."):
        raise TosakitError(f"the sandbox runs tosakit's own handlers only, not {name!r}")
    return getattr(importlib.import_module(module), function)


def _reply(request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run one request: its outputs, or its error with the error's hint and kind; a fault of the simulator
    itself (not of its input) as ``bug``."""
    inputs = [request[f"in{k}"] for k in range(sum(key.startswith("in") for key in request))]
    try:
        if "handler" in request:
            return _handler(request["handler"].item())(request, inputs)
        if "payload" in request:
            return _simulate(request, inputs)
        outputs = run_tosa(request["tosa"].tobytes(), inputs)
    except IndexRangeError as exc:  # the value and the bound travel with it: the caller names the input
        return {**_error(exc.message, exc.hint or "", "IndexRangeError"), "index": np.array([exc.value, exc.high])}
    except TosakitError as exc:
        return _error(exc.message, exc.hint or "", type(exc).__name__)
    except MemoryError:
        return _error("the delegate needs more memory than the limit allows",
                      RAISE_MEMORY_HINT)
    except Exception as exc:  # noqa: BLE001
        if "payload" not in request:
            raise  # the reference model's own fault ends the child, as it always has: the parent reports that
        return {"bug": np.array(f"{type(exc).__name__}: {first_line(exc)}")}
    return {f"out{k}": o for k, o in enumerate(outputs)}


def _raise_index_error(reply: dict[str, np.ndarray], what: str) -> None:
    if "index" in reply:
        value, high = (int(v) for v in reply["index"])
        raise IndexRangeError(f"{what}: {reply['error'].item()}", reply["hint"].item() or None, value, high)


def _error(message: str, hint: str = "", kind: str = "TosakitError") -> dict[str, np.ndarray]:
    return {"error": np.array(message), "hint": np.array(hint), "kind": np.array(kind)}


def _serve(max_memory: int) -> None:
    """The child: run each request, reply with its outputs or its error."""
    import tosa_reference_model  # noqa: F401  (loaded before the address space is capped)

    from .ethosu.simulate import simulate  # noqa: F401

    cap_address_space(max_memory)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while header := stdin.read(LENGTH.size):
        stdout.write(pack_message(_reply(unpack_message(stdin.read(LENGTH.unpack(header)[0])))))
        stdout.flush()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
