"""Arm's ML SDK stack that executes VGF files on a host without an Arm GPU, as ExecuTorch's CI runs its VGF
tests: the Vulkan loader and Mesa's software driver (lavapipe, Debian packages), Arm's ML emulation layer
(VK_ARM_tensors, VK_ARM_data_graph), the scenario runner and the VGF library's ``vgf_dump`` (pinned pip packages).

The layers are named by their manifests, Graph first, and the library path set before the child process starts:
Debian's loader ignores the order in ``VK_INSTANCE_LAYERS`` and device creation then fails for want of
VK_ARM_tensors."""

from __future__ import annotations

import ctypes.util
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import TosakitError

PIP = ("ai-ml-emulation-layer-for-vulkan==0.11.0", "ai-ml-sdk-scenario-runner==0.11.0",
       "ai-ml-sdk-vgf-library==0.11.0")
APT = ("libvulkan1", "mesa-vulkan-drivers")
LAYERS = ("VK_LAYER_ML_Graph_Emulation", "VK_LAYER_ML_Tensor_Emulation")
LAVAPIPE_ICD = Path("/usr/share/vulkan/icd.d")


@dataclass(frozen=True)
class VgfStack:
    """Where the stack's parts are on this machine."""

    layer_dir: Path  # the emulation layer's deploy folder (lib/, share/vulkan/explicit_layer.d/)
    vgf_dump: Path

    def environment(self) -> dict[str, str]:
        """The environment a child process running VGF files starts with."""
        manifests = self.layer_dir / "share" / "vulkan" / "explicit_layer.d"
        library = str(self.layer_dir / "lib")
        return dict(os.environ, VK_LAYER_PATH=f"{manifests / 'VkLayer_Graph.json'}:{manifests / 'VkLayer_Tensor.json'}",
                    LD_LIBRARY_PATH=":".join(p for p in (library, os.environ.get("LD_LIBRARY_PATH")) if p),
                    VK_INSTANCE_LAYERS=":".join(LAYERS), PYTHONDONTWRITEBYTECODE="1")  # the layer's OpenMP
        # threads left to their default: one thread made MobileNetV2's run 0.50 s, not 0.41 s


def _package_dir(module: str) -> Path | None:
    spec = importlib.util.find_spec(module)
    return Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None


def missing() -> list[tuple[str, str]]:
    """The parts of the stack this machine lacks: (what, how to add it) each; empty when it has them all."""
    gaps = []
    if ctypes.util.find_library("vulkan") is None:
        gaps.append(("the Vulkan loader (libvulkan.so.1)", f"apt-get install {' '.join(APT)} (as root)"))
    if not any(LAVAPIPE_ICD.glob("lvp_icd*.json")):
        gaps.append(("Mesa's software Vulkan driver (lavapipe)", "apt-get install mesa-vulkan-drivers (as root)"))
    for module, pin in zip(("emulation_layer", "scenario_runner_py", "vgf_lib"), PIP):
        if importlib.util.find_spec(module) is None:
            gaps.append((f"{pin.split('==')[0]} (Python module {module})", f"pip install {pin} (make setup does)"))
    return gaps


def gaps_text(gaps: list[tuple[str, str]]) -> tuple[str, str]:
    """``missing()``'s parts as one phrase each: what is missing, and how to add it."""
    return "; ".join(w for w, _ in gaps), "; ".join(dict.fromkeys(h for _, h in gaps))


def find_stack() -> VgfStack:
    """The stack, or a TosakitError naming each missing part and how to add it."""
    gaps = missing()
    if gaps:
        what, how = gaps_text(gaps)
        raise TosakitError(f"this machine cannot execute VGF files: it lacks {what}",
                           f"{how} (`tosakit doctor` lists the engines)")
    layer, vgf = _package_dir("emulation_layer"), _package_dir("vgf_lib")
    return VgfStack(layer / "deploy", vgf / "binaries" / "bin" / "vgf_dump")
