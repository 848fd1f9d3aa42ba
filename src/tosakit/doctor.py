"""``tosakit doctor``: which engines this machine has to run programs on the host (as ExecuTorch's
``check_env --host-emulator`` says for its emulator), and for each missing one why and how to add it."""

from __future__ import annotations

import importlib.util
import time
from dataclasses import dataclass

import numpy as np

from .errors import TosakitError, first_line


@dataclass(frozen=True)
class EngineStatus:
    """One engine: what it runs, whether this machine can, and if not why and how to fix it."""

    name: str
    runs: str
    ready: bool
    detail: str

    def __str__(self) -> str:
        return f"{self.name:<5} {'ready' if self.ready else 'MISSING':<8} {self.runs}: {self.detail}"


def _tosa() -> EngineStatus:
    runs = "TOSA graphs (every delegate compiled with --debug-info) on the TOSA reference model"
    if importlib.util.find_spec("tosa_reference_model") is None:
        return EngineStatus("tosa", runs, False, "tosa-tools is not installed; fix: pip install tosa-tools==2026.8.0 "
                                                 "(make setup does)")
    return EngineStatus("tosa", runs, True, "tosa-tools 2026.8.0")


def _vgf(live: bool) -> EngineStatus:
    from .runtime.vgf.stack import gaps_text, missing

    runs = "VGF delegates' payloads on Arm's ML SDK (emulation layer over Mesa's lavapipe)"
    gaps = missing()
    if gaps:
        what, how = gaps_text(gaps)
        return EngineStatus("vgf", runs, False, f"lacks {what}; fix: {how}")
    if not live:
        return EngineStatus("vgf", runs, True, "every part installed (not started: drop --quick to run a graph)")
    try:
        seconds, exact = _vgf_live()
    except TosakitError as exc:
        return EngineStatus("vgf", runs, False, f"installed, but a one-layer graph did not run: {exc.message}; "
                                                "fix: `make vulkan` (as root), then report this output to tosakit")
    verdict = "bit-exact with" if exact else "DIFFERENT from"
    return EngineStatus("vgf", runs, exact, f"ran a one-layer int8 graph in {seconds:.1f} s, {verdict} the TOSA "
                                            "reference model")


def _vgf_live() -> tuple[float, bool]:
    """A small quantized convolution compiled for vgf (carrying its TOSA) and run on the VGF engine, compared with
    the reference model on the same inputs."""
    import torch

    from .flow import compile
    from .runtime import LoadedProgram
    from .specs import VgfCompileSpec

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()).eval()
    x = (torch.rand(1, 3, 8, 8) * 2 - 1,)
    compiled = compile(model, x, VgfCompileSpec().with_debug_info(), quantize=True)
    start = time.perf_counter()
    program = LoadedProgram(compiled.program.buffer, "doctor.pte", engine="vgf")
    try:
        _, comparisons = program.run_and_compare([t.numpy() for t in x])
    except TosakitError:
        raise
    except Exception as exc:  # noqa: BLE001  (the stack's own failure is the finding)
        raise TosakitError(first_line(exc)) from None
    return time.perf_counter() - start, bool(comparisons) and all(c.bit_exact for c in comparisons)


def engines(live: bool = True) -> list[EngineStatus]:
    """Every engine of ``tosakit run`` on this machine."""
    npu = EngineStatus("npu", "Ethos-U55/U65/U85 command streams on tosakit's simulator", True,
                       f"pure Python (numpy {np.__version__}) with Vela's weight codec")
    return [npu, _tosa(), _vgf(live)]
