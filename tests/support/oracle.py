"""The ExecuTorch oracle: tests/oracle/et_oracle.py run in the oracle venv (ExecuTorch 1.5.1), one process per
test worker."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import numpy as np

from support import REPO


class OracleFailure(AssertionError):
    """The ExecuTorch runtime refused a program; the message carries its log."""


class EtOracle:
    """Runs tests/oracle/et_oracle.py in the oracle venv (ExecuTorch 1.5.1) and parses its answer."""

    Failure = OracleFailure
    SCRIPT = REPO / "tests" / "oracle" / "et_oracle.py"
    MARKER = "ET_ORACLE_RESULT "
    TIMEOUT = 900  # seconds for one request

    def __init__(self, python: Path):
        self.python = python
        self._server: subprocess.Popen | None = None
        self._exporter: EtOracle | None = None  # a second process for export_ethosu

    def _serve(self) -> subprocess.Popen:
        """The oracle process of this test worker, started on first use (and again after a crash)."""
        if self._server is None or self._server.poll() is not None:
            self._server = subprocess.Popen([str(self.python), str(self.SCRIPT), "serve"], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self._server

    def _call(self, command: str, **request) -> dict:
        server = self._serve()
        request = {k: str(v) if isinstance(v, os.PathLike) else v for k, v in request.items()}
        server.stdin.write(json.dumps({"command": command, **request}) + "\n")
        server.stdin.flush()
        watchdog = threading.Timer(self.TIMEOUT, server.kill)  # a hung runtime fails the test, not the suite
        watchdog.start()
        try:
            result = self._answer(server)
        finally:
            watchdog.cancel()
        if "error" in result:
            raise OracleFailure("\n".join([result["error"], *result.get("log", [])]))
        return result

    def _answer(self, server: subprocess.Popen) -> dict:
        for line in server.stdout:  # imports print unrelated noise before the first answer
            if line.startswith(self.MARKER):
                return json.loads(line[len(self.MARKER):])
        return {"error": f"the ExecuTorch runtime died (exit status {server.wait()})"}

    def close(self) -> None:
        if self._server is not None and self._server.poll() is None:
            self._server.stdin.close()
            self._server.wait(timeout=60)
        if self._exporter is not None:
            self._exporter.close()

    def load(self, pte: str | os.PathLike, method: str | None = None) -> list[str]:
        """load_program with InternalConsistency verification (and load_method); the method names."""
        return self._call("load", pte=pte, method=method or "")["methods"]

    def run(self, pte: str | os.PathLike, inputs, data: str | os.PathLike | None = None) -> list[np.ndarray]:
        """Execute ``forward`` on ``inputs`` (numpy arrays or torch tensors, channels-last ones passed so), the
        program's named data from the .ptd ``data`` when given; the outputs."""
        import torch

        pte = Path(pte)
        ins, outs = pte.with_suffix(".inputs.npz"), pte.with_suffix(".outputs.npz")
        np.savez(ins, **{f"arg{i}": np.asarray(x) for i, x in enumerate(inputs)})
        channels_last = [i for i, x in enumerate(inputs) if getattr(x, "dim", lambda: 0)() == 4
                         and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)]
        count = self._call("run", pte=pte, inputs=ins, outputs=outs, channels_last=channels_last,
                           data=data)["outputs"]
        with np.load(outs) as saved:
            return [saved[f"out{i}"] for i in range(count)]

    def run_calls(self, pte: str | os.PathLike, calls: list[tuple[str, tuple]]) -> list[list[np.ndarray]]:
        """Load ``pte`` once and execute its methods in turn, ``calls`` being (method, inputs): each call's
        outputs (the program's state carries from call to call, and between methods)."""
        pte = Path(pte)
        ins, outs = pte.with_suffix(".inputs.npz"), pte.with_suffix(".outputs.npz")
        np.savez(ins, **{f"c{k}_arg{i}": np.asarray(x) for k, (_, inputs) in enumerate(calls)
                         for i, x in enumerate(inputs)})
        self._call("run_calls", pte=pte, inputs=ins, outputs=outs, calls=[m for m, _ in calls])
        with np.load(outs) as saved:
            return [[saved[name] for name in sorted((n for n in saved.files if n.startswith(f"c{k}_out")),
                                                     key=lambda n: int(n.rsplit("out", 1)[1]))]
                    for k in range(len(calls))]

    def kernels(self) -> set[str]:
        """'aten::add.out', ...: every operator the runtime registers a kernel for."""
        return set(self._call("kernels")["kernels"])

    def kernel_schemas(self) -> dict[str, str]:
        """Each registered kernel's schema, as torch prints it beside ExecuTorch 1.5.1."""
        return self._call("kernels")["schemas"]

    def export_program(self, exported, out_pte: str | os.PathLike) -> Path:
        """A .pte made by ExecuTorch itself (``to_edge``, no partitioner) from a torch ExportedProgram."""
        import torch

        out_pte = Path(out_pte)
        saved = out_pte.with_suffix(".pt2")
        torch.export.save(exported, saved)
        self._call("export", model_py=saved, out_pte=out_pte)
        return out_pte

    def export_ethosu(self, module, inputs, folder: str | os.PathLike, name: str = "model",
                      target: str = "ethos-u55-128", memory_mode: str | None = None, quantized: bool = False,
                      bundleio: bool = False, external_blocks: str | None = None) -> dict:
        """An Ethos-U (or, ``target`` "vgf", VGF) program made by ExecuTorch's own Arm backend (its tutorial flow: EthosUQuantizer, calibrate
        on ``inputs``, EthosUPartitioner, to_executorch; tests/oracle/et_export.py) from ``module`` and each
        delegate's TOSA, written into ``folder``; et_export.py's result: {"pte", "quantized" (the quantized graph
        it lowered, .pt2), "delegates": [{"backend", "tosa", "payload_sha256"}] in call order, "cpu_ops",
        "vela_flags", "seconds"}. With ``quantized``, ``module`` is a quantized graph ExecuTorch only lowers; with
        ``bundleio``, NAME.bpte is written too (aot_arm_compiler --bundleio's); with ``external_blocks`` (a tag),
        Vela's command stream and weights go to TAG.ptd.
        Runs in a process of its own, so the runtime oracle never has the Arm backend imported."""
        model, saved_inputs = _saved_job(module, inputs, folder, name)
        converter = ""
        if target == "vgf":
            from tosakit.backends.vgf import model_converter

            converter = str(model_converter())
        return self._exporting()._call("export_ethosu", name=name, model=model, inputs=saved_inputs, target=target,
                                       memory_mode=memory_mode, out=folder, quantized=quantized,
                                       model_converter=converter, bundleio=bundleio,
                                       external_blocks=external_blocks)

    def cortex_m_op(self, op: str, cases: list[list], folder: str | os.PathLike) -> list:
        """ExecuTorch's reference implementation of ``cortex_m::op`` on each argument list of ``cases``; the
        results."""
        import torch

        folder = Path(folder)
        saved, out = folder / f"{op}.args.pt", folder / f"{op}.out.pt"
        torch.save([list(args) for args in cases], saved)
        self._exporting()._call("cortex_m_op", op=op, args=saved, out=out)
        return torch.load(out)

    def cortex_m_export(self, module, inputs, folder: str | os.PathLike, target: str | list[str] = "cortex-m55",
                        name: str = "model", quantized: bool = False) -> dict:
        """A program made by ExecuTorch's Cortex-M flow (tests/oracle/et_cortex_m.py) from ``module`` (a float
        model, channels-last, or with ``quantized`` a quantized graph it only lowers); its result: {"pte",
        "quantized", "calls": [{"op", "args"}], "constants", "reference"}, and with a list of targets (quantized
        once, lowered for each) every target's under "targets"."""
        model, saved_inputs = _saved_job(module, inputs, folder, name)
        targets = [target] if isinstance(target, str) else list(target)
        return self._exporting()._call("cortex_m_export", name=name, model=model, inputs=saved_inputs,
                                       targets=targets, out=folder, quantized=quantized)

    def bundled(self, bpte: str | os.PathLike, atol: float = 0.01, rtol: float = 0.01, read_back: bool = True,
                suites: list | None = None) -> dict:
        """A .bpte in ExecuTorch: {"version", "suites": [{"method", "cases"}], "verified": [[method, case, ok,
        error]] (its runtime's verify_result_with_bundled_expected_output), "values": {name: array} (its
        serializer's reading: s{suite}_c{case}_in{i}, _out{i}; its runtime's outputs, _got{i})}. Without
        ``read_back`` (seconds per MB of program) ``suites`` ([[method, test cases]]) names what to verify."""
        import numpy as np

        out = Path(bpte).with_suffix(".et.npz")
        result = self._call("bundled", bpte=bpte, atol=atol, rtol=rtol, out=out, read_back=read_back,
                            suites=suites)
        with np.load(out) as arrays:
            result["values"] = {k: arrays[k] for k in arrays.files}
        return result

    def bundle(self, pte: str | os.PathLike, inputs, expected, out: str | os.PathLike) -> Path:
        """A .bpte made by ExecuTorch's serializer: ``pte`` with one test case of ``forward``."""
        saved = Path(out).with_suffix(".case.npz")
        np.savez(saved.with_suffix(".in.npz"), **{f"arg{i}": np.asarray(x) for i, x in enumerate(inputs)})
        np.savez(saved.with_suffix(".out.npz"), **{f"out{i}": np.asarray(x) for i, x in enumerate(expected)})
        self._call("bundle", pte=pte, inputs=saved.with_suffix(".in.npz"), expected=saved.with_suffix(".out.npz"),
                   out=out)
        return Path(out)

    def etdump(self, etdump: str | os.PathLike, debug_buffer: str | os.PathLike | None = None,
               pte: str | os.PathLike | None = None, inputs=None) -> list:
        """ExecuTorch's Inspector on an ETDump: [[block name, [[event name, instruction id, runs timed, debug
        values]]]]; with ``pte`` and ``inputs``, ExecuTorch's runtime runs the program first and writes ``etdump``."""
        saved = None
        if pte is not None:
            saved = Path(etdump).with_suffix(".inputs.npz")
            np.savez(saved, **{f"arg{i}": np.asarray(x) for i, x in enumerate(inputs)})
        return self._call("etdump", etdump=etdump, debug_buffer=debug_buffer, pte=pte, inputs=saved)["blocks"]

    def cortex_m_schemas(self, ops: list[str]) -> dict[str, str]:
        """Each ``cortex_m::op.out`` schema as ExecuTorch 1.5.1 registers it."""
        return self._exporting()._call("cortex_m_schemas", ops=list(ops))["schemas"]

    def _exporting(self) -> "EtOracle":
        """The process that imports ExecuTorch's backends (kept apart from the runtime oracle's)."""
        if self._exporter is None:
            self._exporter = EtOracle(self.python)
        return self._exporter

    def export(self, model_source: str, out_pte: str | os.PathLike) -> Path:
        """A .pte made by ExecuTorch itself; ``model_source`` defines ``model`` and ``example_inputs``."""
        out_pte = Path(out_pte)
        source = out_pte.with_suffix(".model.py")
        source.write_text(model_source)
        self._call("export", model_py=source, out_pte=out_pte)
        return out_pte


def _saved_job(module, inputs, folder: str | os.PathLike, name: str) -> tuple[Path, Path]:
    """``module`` exported and saved (.pt2) into ``folder`` (made if missing) beside its inputs (.pt)."""
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    inputs = tuple(inputs)
    model, saved_inputs = folder / f"{name}.pt2", folder / f"{name}.inputs.pt"
    torch.export.save(torch.export.export(module, inputs), model)
    torch.save(inputs, saved_inputs)
    return model, saved_inputs
