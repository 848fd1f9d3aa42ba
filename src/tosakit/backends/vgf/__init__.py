"""VgfBackend: TOSA to a VGF file with the ML SDK ``model-converter``."""

from __future__ import annotations

import importlib.util
import subprocess
import tempfile
from pathlib import Path

from torch.fx.passes.operator_support import OperatorSupportBase

from ...errors import TosakitError
from ...lower import LoweredGraph, TOSAPartitioner
from ...specs import ArmCompileSpec, VgfCompileSpec, require_spec
from ..registry import PreprocessResult, backend


def model_converter() -> Path:
    """Path of the ``model-converter`` binary that ai-ml-sdk-model-converter installs."""
    spec = importlib.util.find_spec("model_converter")
    if spec is not None and spec.submodule_search_locations:
        path = Path(list(spec.submodule_search_locations)[0]) / "binaries" / "bin" / "model-converter"
        if path.is_file():
            return path
    raise TosakitError("model-converter not found", "pip install ai-ml-sdk-model-converter==0.11.0 (make setup does)")


def convert(tosa: bytes, flags: list[str] | None = None) -> bytes:
    """Run model-converter on a TOSA flatbuffer; return the VGF bytes."""
    with tempfile.TemporaryDirectory(prefix="tosakit-vgf-") as tmp:
        src, dst = Path(tmp) / "graph.tosa", Path(tmp) / "graph.vgf"
        src.write_bytes(tosa)
        cmd = [str(model_converter()), "-i", str(src), "-o", str(dst), *(flags or [])]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0 or not dst.is_file():
            text = (done.stderr or done.stdout).strip().splitlines()
            detail = next((ln for ln in text if "error" in ln.lower()), text[-1] if text else "no output")
            raise TosakitError(f"model-converter failed (exit {done.returncode}): {detail}",
                               "check the compiler_flags of VgfCompileSpec; run with -i DIR to keep the TOSA input")
        data = dst.read_bytes()
    if data[:4] != b"VGF1":
        raise TosakitError("model-converter wrote a file that is not VGF (no VGF1 header)",
                           "reinstall ai-ml-sdk-model-converter==0.11.0")
    return data


@backend("VgfBackend")
def preprocess(lowered: LoweredGraph, spec: ArmCompileSpec) -> PreprocessResult:
    """The raw .vgf file is the payload (stored inline)."""
    vgf = convert(lowered.tosa, spec.compiler_flags)
    return PreprocessResult(vgf, None, {"tosa": lowered.tosa, "vgf": vgf})


class VgfPartitioner(TOSAPartitioner):
    """Partitions subgraphs for the Arm VGF backend."""

    def __init__(self, compile_spec: VgfCompileSpec, additional_checks: list[OperatorSupportBase] | None = None):
        super().__init__(require_spec(compile_spec, VgfCompileSpec, "VgfPartitioner"), additional_checks)
