"""Where two compilers' Vela cycles go, per TOSA operator type and per layer: tosakit's delegates against
ExecuTorch 1.5.1's, for a model and target `bench/run.py zoo --compare-executorch` has run.

    python bench/layers.py NAME TARGET [--top N]
    python bench/layers.py SPEC TARGET --sweep     (a model `make bench -- sweep-field` has run, e.g. timm:repvit_m0_9)

tosakit's TOSA is recompiled from bench/out/models/NAME.pt2 (the module both compilers started from) and written
to bench/out/tosakit/NAME_TARGET/; ExecuTorch's is the TOSA its run left in bench/out/executorch/NAME_TARGET/. Both
are measured by the same Vela run (tosakit's flags for the target, as bench/run.py measures them)."""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
MEMORY = {"ethos-u55-128": "Shared_Sram", "ethos-u85-256": None}


def sweep_paths(spec: str, target: str) -> tuple[Path, Path, Path]:
    """The sweep's exported model, its folder for tosakit's TOSA, and ExecuTorch's TOSA folder, for ``spec``."""
    import re

    key = re.sub(r"[^A-Za-z0-9_.-]", "_", spec)
    sweep = OUT / "sweep"
    return (sweep / "models" / f"{key}.pt2", sweep / "tosakit-work" / key / target,
            sweep / "executorch-work" / key / target)


def tosakit_tosa(name: str, target: str, sweep: bool = False) -> list[Path]:
    import torch

    from tosakit.flow import compile
    from tosakit.specs import EthosUCompileSpec

    model_path, folder, _ = sweep_paths(name, target) if sweep else (OUT / "models" / f"{name}.pt2",
                                                                     OUT / "tosakit" / f"{name}_{target}", None)
    found = sorted(folder.glob("*.tosa"))
    if found:
        return found
    spec = EthosUCompileSpec(target, memory_mode=MEMORY[target])
    spec.dump_intermediate_artifacts_to(str(folder))
    model = torch.export.load(model_path).module()
    inputs = torch.load(model_path.with_suffix(".inputs.pt"))
    compile(model, inputs, spec, quantize=True)
    return sorted(folder.glob("*.tosa"))


def measure(paths: list[Path], target: str):
    """Per TOSA op type: (count, cycles); per layer rows; totals."""
    from tosakit.backends.ethosu.vela import _tosa_blocks, compile_tosa
    from tosakit.specs import EthosUCompileSpec

    spec = EthosUCompileSpec(target, memory_mode=MEMORY[target])
    counts, cycles, layers, total = collections.Counter(), collections.Counter(), [], 0
    for path in paths:
        tosa = path.read_bytes()
        for block in _tosa_blocks(tosa):
            counts.update(block)
        report = compile_tosa(tosa, spec).report
        total += report.total_cycles
        for op in report.per_op:
            key = op.tosa_op or op.operator
            cycles[key] += op.cycles
            layers.append((op.cycles, key, op.npu_operator, op.name, op.macs, op.bound_by))
    return counts, cycles, layers, total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("name")
    parser.add_argument("target")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", help="write both tools' per-layer rows here")
    parser.add_argument("--sweep", action="store_true", help="NAME is a model of the field sweep (its folders)")
    args = parser.parse_args(argv)
    mine = measure(tosakit_tosa(args.name, args.target, args.sweep), args.target)
    theirs_folder = (sweep_paths(args.name, args.target)[2] if args.sweep
                     else OUT / "executorch" / f"{args.name}_{args.target}")
    theirs = measure(sorted(theirs_folder.glob("output_*.tosa")), args.target)
    print(f"{args.name} {args.target}: total cycles tosakit {mine[3]:,}  executorch {theirs[3]:,}  "
          f"ratio {mine[3] / max(1, theirs[3]):.3f}")
    print(f"\n{'TOSA op':<22}{'tosakit n':>10}{'cycles':>12}{'executorch n':>14}{'cycles':>12}{'diff':>12}")
    keys = sorted(set(mine[0]) | set(theirs[0]) | set(mine[1]) | set(theirs[1]),
                  key=lambda k: -(abs(mine[1][k] - theirs[1][k])))
    for k in keys:
        print(f"{k:<22}{mine[0][k]:>10}{mine[1][k]:>12,}{theirs[0][k]:>14}{theirs[1][k]:>12,}"
              f"{mine[1][k] - theirs[1][k]:>+12,}")
    for label, data in (("tosakit", mine), ("executorch", theirs)):
        print(f"\n{label}: top {args.top} layers by cycles")
        for row in sorted(data[2], reverse=True)[:args.top]:
            c, tosa_op, npu_op, tensor, macs, bound = row
            print(f"  {c:>10,}  {tosa_op:<16}{npu_op:<22}{bound:<10}{macs:>12,}  {tensor[:60]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"tosakit": mine[2], "executorch": theirs[2]}, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
