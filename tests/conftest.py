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
