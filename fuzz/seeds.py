"""The valid programs the fuzzers damage: small, fast to run, and together covering every part of a .pte
the host runtime reads — CPU kernels of every value kind, quantized I/O, and TOSA, Ethos-U (U55, U85)
and VGF delegates with their carried TOSA; and the Ethos-U delegate payloads the simulator's fuzzers
damage (convolution, depthwise, pooling, elementwise with LUTs, DMA, fast scratch, int16)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tosakit.errors import write_atomic
from tosakit.flow import compile
from tosakit.specs import compile_spec_for_target


class SmallNet(nn.Module):
    """conv, relu, pool, linear: what every delegate takes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.avg_pool2d(torch.relu(self.conv(x)), 2), 1))


class ListNet(nn.Module):
    """Kernels whose values are lists and several outputs: split, max-pool with indices, layer norm, cat."""

    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)

    def forward(self, x):
        a, b = torch.split(x, [4, 4], dim=-1)
        pooled, indices = nn.functional.max_pool2d(x, 2, return_indices=True)
        return torch.cat([self.norm(x), b, a], dim=-1), pooled, indices


# name -> (model, target, quantize, delegate, carry TOSA)
SEEDS = {
    "cpu_fp": (SmallNet, "TOSA-1.0+FP", False, False, False),
    "cpu_int": (SmallNet, "ethos-u55-128", True, False, False),
    "cpu_lists": (ListNet, "TOSA-1.0+FP", False, False, False),
    "tosa_fp": (SmallNet, "TOSA-1.0+FP", False, True, False),
    "tosa_int": (SmallNet, "TOSA-1.0+INT", True, True, False),
    "ethos_u55": (SmallNet, "ethos-u55-128", True, True, True),
    "ethos_u55_payload_only": (SmallNet, "ethos-u55-128", True, True, False),
    "ethos_u85": (SmallNet, "ethos-u85-256", True, True, True),
    "vgf": (SmallNet, "vgf", False, True, True),
}


# Seeds bundled with a test case (.bpte): the program of a seed above, its example input, the outputs expected.
BUNDLED_SEEDS = ("cpu_int", "ethos_u55")


def build_seeds(folder: Path) -> list[Path]:
    """Write every seed program (and the bundled ones) into ``folder`` (kept when already there); their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, (model_cls, target, quantize, delegate, carry) in SEEDS.items():
        path, bundled = folder / f"{name}.pte", folder / f"{name}_bundled.bpte"
        if not path.exists() or (name in BUNDLED_SEEDS and not bundled.exists()):
            torch.manual_seed(0)
            model = model_cls().eval()
            inputs = (torch.randn(1, 3, 8, 8),)
            spec = compile_spec_for_target(target)
            spec.embed_tosa = carry
            compiled = compile(model, inputs, spec, quantize=quantize, delegate=delegate)
            write_atomic(path, compiled.program.buffer)
            if name in BUNDLED_SEEDS:
                write_atomic(bundled, _bundle(compiled, model, inputs))
        paths += [path] + ([bundled] if name in BUNDLED_SEEDS else [])
    return paths


def _bundle(compiled, model, inputs) -> bytes:
    from tosakit.program.bundled import (BundledProgram, MethodTestCase, MethodTestSuite,
                                         serialize_from_bundled_program_to_flatbuffer)
    from tosakit.runtime import evaluate_exact

    expected = evaluate_exact(compiled.quantized, *inputs) if compiled.quantized is not None else (model(*inputs),)
    case = MethodTestCase(list(inputs), [t.detach() for t in expected])
    return serialize_from_bundled_program_to_flatbuffer(BundledProgram(compiled.program,
                                                                       [MethodTestSuite("forward", [case])]))


# name -> (built-in model, target, memory mode, 16-bit activations): together every operation family the
# simulator runs, every region, both OFM micro-block depths
NPU_SEEDS = {
    "digits_u55_128": ("digits", "ethos-u55-128", None, False),
    "softmax_u55_128": ("softmax", "ethos-u55-128", None, False),
    "waves_u65_256_dedicated": ("waves", "ethos-u65-256", "Dedicated_Sram", False),
    "audio1d_u55_256_sram_only": ("audio1d", "ethos-u55-256", "Sram_Only", False),
    "digits_a16w8_u55_64": ("digits", "ethos-u55-64", None, True),
    "digits_u85_256": ("digits", "ethos-u85-256", None, False),  # fast-decode and 2:4 sparse weights
    "softmax_u85_2048": ("softmax", "ethos-u85-2048", None, False),  # LUTs, chained operations
    "transformer_u85_128": ("transformer", "ethos-u85-128", None, False),  # MatMul (IFM2 as weights), transposes
    "unet_u85_512": ("unet", "ethos-u85-512", None, False),  # RESIZE nearest and bilinear, two cores
}


def build_npu_seeds(folder: Path, names=tuple(NPU_SEEDS)) -> list[Path]:
    """Write the Ethos-U delegate payloads of the NPU seeds ``names`` into ``folder`` (kept when already
    there); their paths (one per delegate: ``<name>.bin``, ``<name>-<k>.bin`` after the first)."""
    from tosakit.program import LoweredBackendModule
    from tosakit.quantize import get_symmetric_a16w8_quantization_config
    from tosakit.specs import EthosUCompileSpec
    from tosakit.zoo import MODELS

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in names:
        model_name, target, memory_mode, a16w8 = NPU_SEEDS[name]
        found = sorted(folder.glob(f"{name}.bin")) + sorted(folder.glob(f"{name}-*.bin"))
        if not found:
            torch.manual_seed(0)
            model, inputs = MODELS[model_name].factory()
            options = {"config": get_symmetric_a16w8_quantization_config()} if a16w8 else {}
            compiled = compile(model.eval(), inputs, EthosUCompileSpec(target, memory_mode=memory_mode),
                               quantize=True, calibration=[inputs], **options)
            blobs = [m.processed_bytes for m in compiled.edge.program.graph_module.children()
                     if isinstance(m, LoweredBackendModule) and m.backend_id == "EthosUBackend"]
            for k, blob in enumerate(blobs):
                path = folder / (f"{name}.bin" if k == 0 else f"{name}-{k}.bin")
                write_atomic(path, blob)
                found.append(path)
        paths += found
    return paths
