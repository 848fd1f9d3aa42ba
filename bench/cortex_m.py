"""The direct Cortex-M flow beside ExecuTorch 1.5.1's (its CortexMQuantizer and pass manager, side environment):
per network, program size, planned arena, compute left to portable kernels and compile seconds."""

from __future__ import annotations

import time
from pathlib import Path

# The networks ExecuTorch validates its Cortex-M backend on (all in the zoo).
NETWORKS = ("mv2", "mv3", "ds_cnn", "mobilenet_v1_025", "resnet8", "deep_autoencoder")
TARGET = "cortex-m55"
DATA_MOVES = ("view_copy", "clone", "_clone_dim_order", "quantize_per_tensor", "dequantize_per_tensor")


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
