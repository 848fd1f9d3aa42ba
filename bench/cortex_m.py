"""The direct Cortex-M flow beside ExecuTorch 1.5.1's (its CortexMQuantizer and pass manager, side environment):
per network, program size, planned arena, compute left to portable kernels and compile seconds."""

from __future__ import annotations

import time
from pathlib import Path

# The networks ExecuTorch validates its Cortex-M backend on (all in the zoo).
NETWORKS = ("mv2", "mv3", "ds_cnn", "mobilenet_v1_025", "resnet8", "deep_autoencoder")
TARGET = "cortex-m55"
DATA_MOVES = ("view_copy", "clone", "_clone_dim_order", "quantize_per_tensor", "dequantize_per_tensor")
# Published latencies (ms) of MLPerf Tiny's four networks (DS-CNN, ResNet-8, MobileNetV1-0.25, the autoencoder) on
# silicon running CMSIS-NN, beside which the cycle estimates print. (core, clock MHz, source, latencies.)
PUBLISHED = (
    ("cortex-m55", 400, "Alif E8, ExecuTorch + CMSIS-NN (issue 35's figures)",
     {"ds_cnn": 5.82, "resnet8": 15.23, "mobilenet_v1_025": 21.75, "deep_autoencoder": 1.21}),
    ("cortex-m33", 128, "nRF5340, microTVM + CMSIS-NN (MLPerf Tiny v1.1, Krai; the DSP scale is from its IC)",
     {"ds_cnn": 1e3 / 13.072, "resnet8": 1e3 / 3.147, "mobilenet_v1_025": 1e3 / 4.286,
      "deep_autoencoder": 1e3 / 158.957}),
    ("cortex-m4", 120, "STM32L4R5, microTVM + CMSIS-NN (MLPerf Tiny v1.1, Krai)",
     {"ds_cnn": 1e3 / 10.018, "resnet8": 1e3 / 2.567, "mobilenet_v1_025": 1e3 / 3.324,
      "deep_autoencoder": 1e3 / 116.212}),
)


def _figures(pte: Path) -> tuple[int, int, int]:
    """(bytes, planned arena bytes, compute kernels outside cortex_m::) of a program file."""
    from tosakit.program import deserialize_pte

    plan = deserialize_pte(pte.read_bytes())[0].execution_plan[0]  # read, not loaded: ExecuTorch calls kernels
    # tosakit's runtime does not run yet
    portable = [o.name for o in plan.operators if not o.name.startswith("cortex_m::")
                and not o.name.split("::")[1].startswith(DATA_MOVES)]
    return pte.stat().st_size, sum(plan.non_const_buffer_sizes), len(portable)


def cortex_m(args, out: Path, executorch) -> None:
    """Each network compiled for cortex-m55 by tosakit and by ExecuTorch: .pte bytes, arena bytes, portable
    compute kernels, compile seconds."""
    import torch

    from tosakit.flow import channels_last, compile
    from tosakit.zoo import MODELS

    jobs, ours = [], {}
    folder = out / "cortex_m"
    folder.mkdir(parents=True, exist_ok=True)
    for name in NETWORKS:
        model, inputs = MODELS[name].factory()
        start = time.perf_counter()
        compiled = compile(model.eval(), inputs, TARGET, quantize=True)
        seconds = time.perf_counter() - start
        (folder / f"{name}.pte").write_bytes(compiled.program.buffer)
        ours[name] = (*_figures(folder / f"{name}.pte"), seconds)
        model, inputs = channels_last(model, inputs)
        torch.export.save(torch.export.export(model, inputs), folder / f"{name}.pt2")
        torch.save(inputs, folder / f"{name}.inputs.pt")
        jobs.append({"name": name, "target": TARGET, "model": str(folder / f"{name}.pt2"),
                     "inputs": str(folder / f"{name}.inputs.pt"), "out": str(folder / "executorch")})
    estimates(folder)
    theirs = executorch(jobs)
    print(f"{'network':<18}{'pte bytes tosakit / ET':>28}{'arena bytes':>26}{'portable ops':>16}{'compile s':>14}")
    for name in NETWORKS:
        mine, result = ours[name], theirs.get((name, TARGET), {"error": "no result"})
        if "error" in result:
            print(f"{name:<18}{mine[0]:>13,} / ExecuTorch failed: {result['error'][:80]}")
            continue
        et = _figures(Path(result["pte"]))
        print(f"{name:<18}{mine[0]:>13,} / {et[0]:>12,}{mine[1]:>13,} / {et[1]:>10,}{mine[2]:>8} / {et[2]:>5}"
              f"{mine[3]:>7.1f} / {result['seconds']:>5.1f}")


def estimates(folder: Path) -> None:
    """Each network's estimated cycles per core (``tosakit inspect --cpu``'s total) beside published latencies."""
    from tosakit.runtime import load
    from tosakit.runtime.cpu_cycles import board_for, cpu_cycles

    print(f"\n{'network':<18}{'core':<12}{'estimated cycles':>18}{'estimated ms':>14}{'published ms':>14}{'off':>8}")
    for core, mhz, source, published in PUBLISHED:
        board = board_for(core)
        assert board.clock_hz == mhz * 1e6, (core, board.clock_hz)
        for name, ms in published.items():
            c = cpu_cycles(load(folder / f"{name}.pte").plan(), core)
            mine = c.milliseconds(c.total)
            print(f"{name:<18}{core:<12}{c.total:>18,}{mine:>14.2f}{ms:>14.2f}{100 * (mine / ms - 1):>+7.0f}%")
        print(f"  ({core} at {mhz} MHz: {source}; estimated for {board.name})")
    print("  DS-CNN's first layer is a depthwise convolution with 64 outputs per input channel in ExecuTorch's graph "
          "(CMSIS-NN's generic loop on DSP cores), a convolution in MLPerf Tiny's TFLite model.")
