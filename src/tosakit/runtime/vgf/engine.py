"""The VGF engine: a VgfBackend delegate's payload executed by Arm's ML SDK stack (``stack``) in a child process,
so a crash of the driver or the emulation layer ends the child, never the user's process.

The child (``python -m tosakit.runtime.vgf.engine``) builds one scenario per VGF file and keeps it: later calls
only upload inputs, run and download outputs. Before the stack loads a file, the child checks the tensors the
VGF library describes (count, element format, element count) against the call's. Messages are .npz files (never
pickles) behind an 8-byte length, as with the reference model's sandbox."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ...errors import TosakitError
from ...native import captured_output
from ..tosa_sandbox import LENGTH, Child, pack_message, unpack_message
from .stack import VgfStack

# Vulkan tensor formats the model converter writes, as numpy element types.
FORMATS = {"VK_FORMAT_R8_SINT": "int8", "VK_FORMAT_R8_UINT": "uint8", "VK_FORMAT_R8_BOOL_ARM": "bool",
           "VK_FORMAT_R16_SINT": "int16", "VK_FORMAT_R32_SINT": "int32", "VK_FORMAT_R64_SINT": "int64",
           "VK_FORMAT_R16_SFLOAT": "float16", "VK_FORMAT_R32_SFLOAT": "float32"}
DUMP_SECONDS = 60  # vgf_dump describing one file
CACHED_FILES = 16  # VGF files whose built scenarios the child keeps (oldest dropped first)
STACK_HINT = "the delegate may be damaged; if you trust the file, report it to tosakit with `tosakit doctor`'s output"


class VgfEngine(Child):
    """A child process executing VGF files; ``run`` one call at a time, ``close`` when done."""

    def __init__(self, stack: VgfStack, deadline: float, threads: int | None = None):
        """``threads``: the stack's worker threads (OpenMP, lavapipe); by default as many as the cores."""
        self.known: set[str] = set()  # the files the child has been sent
        self.counts: dict[str, tuple[int, int]] = {}  # each file's input and output counts
        env = stack.environment()
        if threads is not None:
            env.update(OMP_NUM_THREADS=str(threads), LP_NUM_THREADS=str(threads))
        super().__init__([sys.executable, "-m", "tosakit.runtime.vgf.engine", str(stack.vgf_dump)], env, deadline)

    def io_counts(self, vgf: bytes, what: str) -> tuple[int, int]:
        """How many inputs and outputs the VGF file takes and gives (the VGF library's description; asked once
        per file)."""
        key = hashlib.sha256(vgf).hexdigest()
        if key not in self.counts:
            reply = self._call(vgf, {"describe": np.array(1)}, what)
            self.counts[key] = int(reply["inputs"]), int(reply["outputs"])
        return self.counts[key]

    def run(self, vgf: bytes, inputs: list[np.ndarray], outputs: list[tuple[np.dtype, tuple[int, ...]]],
            what: str) -> list[np.ndarray]:
        """The VGF file on ``inputs`` (stored order, one array each); ``outputs`` are the (dtype, shape) the call
        expects, in stored order."""
        request = {"outputs": np.array(json.dumps([[str(d), list(s)] for d, s in outputs]))}
        request.update({f"in{k}": np.ascontiguousarray(x) for k, x in enumerate(inputs)})
        reply = self._call(vgf, request, what)
        return [reply[f"out{k}"] for k in range(len(outputs))]

    def _call(self, vgf: bytes, request: dict, what: str) -> dict[str, np.ndarray]:
        key = hashlib.sha256(vgf).hexdigest()
        request["key"] = np.array(key)
        if key not in self.known:
            request["vgf"] = np.frombuffer(vgf, dtype=np.uint8)
        reply = self.exchange(request, what, "the VGF stack")
        if "unknown" in reply:  # the child dropped it from its cache
            reply = self.exchange({**request, "vgf": np.frombuffer(vgf, dtype=np.uint8)}, what, "the VGF stack")
        self.known.add(key)
        if "error" in reply:
            raise TosakitError(f"{what}: {reply['error'].item()}", reply["hint"].item() or STACK_HINT)
        return reply

    def _died(self, what: str, engine: str) -> TosakitError:
        return TosakitError(f"{what}: {engine} stopped ({self.stopped()}) on this delegate", STACK_HINT)


# ---------------------------------------------------------------------------------------------- the child

class _Scenario:
    """One VGF file: the VGF library's description of it, then (on its first run) its scenario, built once."""

    def __init__(self, vgf_dump: str, vgf: bytes, folder: Path):
        self.folder, self.scenario = folder, None
        (folder / "graph.vgf").write_bytes(vgf)
        done = subprocess.run([vgf_dump, "-i", str(folder / "graph.vgf"), "--scenario-template"],
                              capture_output=True, timeout=DUMP_SECONDS)
        if done.returncode != 0:
            raise TosakitError(f"the VGF library cannot describe the file (vgf_dump exit {done.returncode}): "
                               f"{done.stderr.decode(errors='replace').strip()[:200]}")
        self.template = json.loads(done.stdout)
        binding = {b["resource_ref"]: int(b["id"]) for c in self.template["commands"] for d in c.values()
                   for b in d.get("bindings", [])}
        tensors = sorted((r["tensor"] for r in self.template["resources"] if "tensor" in r),
                         key=lambda t: binding.get(t["uid"], -1))
        self.ins, self.outs = [t for t in tensors if "src" in t], [t for t in tensors if "dst" in t]
        # Bindings number the graph's inputs, then its outputs; an input the graph never reads has none (the
        # model converter drops it). So the call's inputs are as many as the first output's binding.
        self.used = [binding.get(t["uid"], -1) for t in self.ins]
        self.call_inputs = binding.get(self.outs[0]["uid"], 0) if self.outs else max(self.used, default=-1) + 1
        if any(not 0 <= b < self.call_inputs for b in self.used) or len(set(self.used)) != len(self.used):
            raise TosakitError(f"the VGF file binds its inputs to {self.used}, not to distinct inputs among the "
                               f"{self.call_inputs} before its first output")

    def _used(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """The call's inputs the graph reads, checked against the VGF's descriptions."""
        if len(inputs) != self.call_inputs:
            raise TosakitError(f"the VGF file takes {self.call_inputs} inputs, the call passes {len(inputs)}")
        used = [inputs[b] for b in self.used]
        _check("input", self.ins, [(x.dtype, x.shape) for x in used])
        return used

    def _build(self, inputs: list[np.ndarray], outputs: list) -> None:
        import scenario_runner_py as runner

        _check("output", self.outs, [(np.dtype(d), tuple(s)) for d, s in outputs])
        for k, t in enumerate(self.ins):
            t["src"] = str(self.folder / f"in{k}.npy")
            np.save(t["src"], inputs[k])
        for k, t in enumerate(self.outs):
            t["dst"] = str(self.folder / f"out{k}.npy")
        for command in self.template["commands"]:
            if "dispatch_graph" in command:
                command["dispatch_vgf"] = command.pop("dispatch_graph")
        graph = next(r["graph"] for r in self.template["resources"] if "graph" in r)
        graph["src"] = str(self.folder / "graph.vgf")
        (self.folder / "scenario.json").write_text(json.dumps(self.template))
        self.scenario = runner.load_scenario(self.folder / "scenario.json", work_dir=self.folder,
                                             output_dir=self.folder)
        self.input_ids = [self.scenario.get_tensor_id(t["uid"]) for t in self.ins]
        self.output_ids = [self.scenario.get_tensor_id(t["uid"]) for t in self.outs]

    def run(self, inputs: list[np.ndarray], outputs: list) -> list[np.ndarray]:
        inputs = self._used(inputs)
        if self.scenario is None:
            self._build(inputs, outputs)
        for tid, x in zip(self.input_ids, inputs):
            self.scenario.upload(tid, np.ascontiguousarray(x))
        self.scenario.run()
        return [np.asarray(self.scenario.download(tid)).view(np.dtype(d)).reshape(s)
                for tid, (d, s) in zip(self.output_ids, outputs)]


def _check(kind: str, described: list[dict], expected: list[tuple[np.dtype, tuple]]) -> None:
    """The VGF's input or output tensors against the call's: count, element type and element count."""
    if len(described) != len(expected):
        raise TosakitError(f"the VGF file has {len(described)} {kind}s, the call passes {len(expected)}")
    for k, (t, (dtype, shape)) in enumerate(zip(described, expected)):
        elements = int(np.prod(t.get("dims", [])))
        if FORMATS.get(t.get("format")) != str(dtype) or elements != int(np.prod(shape)):
            raise TosakitError(f"the VGF file's {kind} {k} is {t.get('format')} {t.get('dims')}, the call's is "
                               f"{dtype}{list(shape)}")


def _answer(request: dict[str, np.ndarray], scenarios: dict[str, _Scenario], vgf_dump: str, tmp: str) -> dict:
    """One request's reply: a file's I/O counts, its outputs, or that the file is no longer cached."""
    key = request["key"].item()
    if key not in scenarios:
        if "vgf" not in request:
            return {"unknown": np.array(1)}  # dropped from the cache: the parent sends it again
        scenarios[key] = _Scenario(vgf_dump, request["vgf"].tobytes(), Path(tempfile.mkdtemp(dir=tmp)))
        while len(scenarios) > CACHED_FILES:
            shutil.rmtree(scenarios.pop(next(iter(scenarios))).folder, ignore_errors=True)
    found = scenarios[key]
    if "describe" in request:
        return {"inputs": np.array(found.call_inputs), "outputs": np.array(len(found.outs))}
    inputs = [request[f"in{k}"] for k in range(sum(name.startswith("in") for name in request))]
    return {f"out{k}": r for k, r in enumerate(found.run(inputs, json.loads(request["outputs"].item())))}


def _serve(vgf_dump: str) -> None:
    """The child: build each new file's scenario, run each request, reply with outputs or an error."""
    scenarios: dict[str, _Scenario] = {}
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    with tempfile.TemporaryDirectory(prefix="tosakit-vgf-run-") as tmp:
        while header := stdin.read(LENGTH.size):
            request = unpack_message(stdin.read(LENGTH.unpack(header)[0]))
            try:
                with captured_output((1, 2)):  # stdout is the reply pipe: nothing native may print to it
                    reply = _answer(request, scenarios, vgf_dump, tmp)
            except TosakitError as exc:
                reply = {"error": np.array(exc.message), "hint": np.array(exc.hint or "")}
            except (RuntimeError, ValueError, OSError, KeyError, subprocess.TimeoutExpired) as exc:
                reply = {"error": np.array(f"the VGF stack refused the file: {type(exc).__name__}: {exc}"[:400]),
                         "hint": np.array("")}
            stdout.write(pack_message(reply))
            stdout.flush()


if __name__ == "__main__":
    _serve(sys.argv[1])
