"""The ExecuTorch 1.5.1 side environment the benchmarks compare against: its Arm backend with tosakit's own pins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIDE_ENV = ROOT / ".venv-executorch"


def side_env() -> Path:
    """The ExecuTorch 1.5.1 side environment (its Arm backend, tosakit's torch/Vela/TOSA pins), built once; the
    test oracle's venv (`make oracle`: the same pins, tests/oracle/requirements.txt) when there is one."""
    for oracle in (os.environ.get("TOSAKIT_ORACLE_PYTHON"), ROOT / ".venv-oracle" / "bin" / "python"):
        if oracle and Path(oracle).exists() and (Path(oracle).parent.parent / ".oracle-installed").exists():
            return Path(oracle)
    python = SIDE_ENV / "bin" / "python"
    stamp = SIDE_ENV / ".installed"
    if not stamp.exists():
        print(f"building {SIDE_ENV} (executorch==1.5.1) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(SIDE_ENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run(pip + ["-r", str(ROOT / "bench" / "executorch-requirements.txt")], check=True)
        subprocess.run(pip + ["--no-deps", "executorch==1.5.1"], check=True)
        stamp.touch()
    return python
