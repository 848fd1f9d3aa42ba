"""Shared pytest fixtures."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ ExecuTorch oracle (et_oracle)


class OracleFailure(AssertionError):
    """The ExecuTorch runtime refused a program; the message carries its log."""


class EtOracle:
    """Runs tests/oracle/et_oracle.py in the oracle venv (ExecuTorch 1.5.1) and parses its answer."""

    Failure = OracleFailure
    SCRIPT = REPO / "tests" / "oracle" / "et_oracle.py"
    MARKER = "ET_ORACLE_RESULT "

    def __init__(self, python: Path):
        self.python = python

    def _call(self, *args) -> dict:
        proc = subprocess.run(
            [str(self.python), str(self.SCRIPT), *map(str, args)], capture_output=True, text=True, timeout=900
        )
        results = [line[len(self.MARKER):] for line in proc.stdout.splitlines() if line.startswith(self.MARKER)]
        result = json.loads(results[-1]) if results else {"error": f"no result (exit status {proc.returncode})"}
        if "error" in result:
            log = [line for line in proc.stderr.splitlines() if "torchao" not in line and "_pytree" not in line]
            raise OracleFailure(f"{result['error']}\n" + "\n".join(log[-30:]))
        return result

    def load(self, pte: str | os.PathLike, method: str | None = None) -> list[str]:
        """load_program with InternalConsistency verification (and load_method); the method names."""
        return self._call("load", pte, *(["--method", method] if method else []))["methods"]

    def run(self, pte: str | os.PathLike, inputs) -> list[np.ndarray]:
        """Execute ``forward`` on ``inputs`` (numpy arrays or torch tensors); the outputs."""
        pte = Path(pte)
        ins, outs = pte.with_suffix(".inputs.npz"), pte.with_suffix(".outputs.npz")
        np.savez(ins, **{f"arg{i}": np.asarray(x) for i, x in enumerate(inputs)})
        count = self._call("run", pte, ins, outs)["outputs"]
        with np.load(outs) as saved:
            return [saved[f"out{i}"] for i in range(count)]

    def export(self, model_source: str, out_pte: str | os.PathLike) -> Path:
        """A .pte made by ExecuTorch itself; ``model_source`` defines ``model`` and ``example_inputs``."""
        out_pte = Path(out_pte)
        source = out_pte.with_suffix(".model.py")
        source.write_text(model_source)
        self._call("export", source, out_pte)
        return out_pte


@pytest.fixture(scope="session")
def et_oracle() -> EtOracle:
    python = Path(os.environ.get("TOSAKIT_ORACLE_PYTHON", REPO / ".venv-oracle" / "bin" / "python"))
    if not python.exists():
        pytest.fail(f"ExecuTorch oracle python {python} not found: run `make oracle` (or `make test`) to create .venv-oracle")
    return EtOracle(python)


# ------------------------------------------------------------------ end of et_oracle


# ------------------------------------------------------------------ lowering harness (op and model tests)


class Harness:
    """Compile a module for a target and prove the result: TOSA on the reference model against
    PyTorch, Vela for Ethos-U, and where every op ended up."""

    FP_TOL = 1e-4
    INT_FRACTION = 0.999

    def compile(self, module, inputs, target, quantize, **kw):
        from tosakit.flow import compile

        return compile(module, inputs, target, quantize=quantize, **kw)

    @staticmethod
    def cpu_compute(compiled) -> list:
        """Ops left on the CPU other than the quantize/dequantize at the delegate boundary."""
        return [p for p in compiled.edge.placements if p.placement == "cpu" and "quantize" not in p.target]

    def assert_delegated(self, compiled):
        left = self.cpu_compute(compiled)
        assert not left, "ops left on the CPU: " + "; ".join(f"{p.node}: {p.reason}" for p in left)
        assert compiled.edge.delegates, "no delegate was created"

    def assert_checks(self, compiled, inputs):
        from tosakit.runtime import check_delegates

        checks = check_delegates(compiled.edge, inputs)
        assert checks, "no delegate output was compared"
        bad = [str(c) for c in checks if not c.passed]
        assert not bad, "; ".join(bad)
        return checks

    def fp(self, module, inputs, target="TOSA-1.0+FP"):
        """Float model, FP profile: delegate matches PyTorch to FP_TOL (relative)."""
        compiled = self.compile(module, inputs, target, quantize=False)
        self.assert_delegated(compiled)
        checks = self.assert_checks(compiled, inputs)
        assert all(not c.integer for c in checks)
        return compiled

    def int(self, module, inputs, target="TOSA-1.0+INT"):
        """Quantized model, INT profile: within one step of the fake-quantized model (convert_pt2e)."""
        compiled = self.compile(module, inputs, target, quantize=True)
        self.assert_delegated(compiled)
        self.assert_checks(compiled, inputs)
        self.assert_matches_fake_quant(compiled, inputs)
        return compiled

    def assert_matches_fake_quant(self, compiled, inputs):
        """The whole program on the host vs the float32 convert_pt2e model, in output steps."""
        import numpy as np
        import torch

        from tosakit.quantize.qdq import is_dequantize, qparams_of
        from tosakit.runtime import run_edge

        got = run_edge(compiled.edge, *inputs)
        with torch.no_grad():
            want = compiled.quantized(*inputs)
        want = want if isinstance(want, (tuple, list)) else (want,)
        gm = compiled.edge.program.graph_module
        out_nodes = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        for node, g, w in zip(out_nodes, got, want):
            step = qparams_of(node, gm).s if is_dequantize(node) else 0.0
            off = np.abs(g.numpy().astype(np.float64) - w.numpy().astype(np.float64)) > step * 1.001 + 1e-6
            assert off.mean() <= 1 - self.INT_FRACTION, f"{100 * off.mean():.3f}% of outputs more than one step off"

    def ethosu(self, module, inputs, target):
        """Quantized for an Ethos-U: every op on the NPU (Vela agrees), integers match PyTorch."""
        compiled = self.compile(module, inputs, target, quantize=True)
        self.assert_delegated(compiled)
        for d in compiled.edge.delegates:
            assert d.backend_id == "EthosUBackend"
            assert d.report.cpu_ops == 0 and d.report.npu_ops > 0, d.report.summary()
        self.assert_checks(compiled, inputs)
        return compiled


@pytest.fixture(scope="session")
def harness() -> Harness:
    return Harness()
