"""tosakit benchmarks: figures printed side by side in one run (make bench)."""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def host_runtime(repeats: int) -> None:
    """mv2 for ethos-u55-128: `tosakit run` of the .pte beside tosa_reference_model alone on its TOSA."""
    import torch

    from tosakit.flow import compile
    from tosakit.quantize.qdq import is_quantize, qparams_of
    from tosakit.runtime import LoadedProgram, run_tosa
    from tosakit.specs import EthosUCompileSpec
    from tosakit.zoo.mobilenet_v2 import build

    model, inputs = build()
    compiled = compile(model, inputs, EthosUCompileSpec("ethos-u55-128").with_debug_info(), quantize=True)
    program = LoadedProgram(compiled.program.buffer, "mv2_arm_delegate_ethos-u55-128.pte")
    gm = compiled.edge.program.graph_module
    [delegate] = [m for m in gm.children() if hasattr(m, "tosa")]
    int8 = qparams_of(next(n for n in gm.graph.nodes if is_quantize(n))).quantize(inputs[0]).numpy()
    program.run(list(inputs))  # warm up both
    run_tosa(delegate.tosa, [int8])
    full = _median_seconds(lambda: program.run(list(inputs)), repeats)
    alone = _median_seconds(lambda: run_tosa(delegate.tosa, [int8]), repeats)
    print(f"{'mv2, ethos-u55-128':<24}{'tosakit run (.pte)':>22}{'reference model alone':>24}{'overhead':>10}")
    print(f"{'median of ' + str(repeats):<24}{full:>21.3f}s{alone:>23.3f}s{100 * (full - alone) / alone:>9.1f}%")


BENCHES = {"host-runtime": host_runtime}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("bench", nargs="*", help=f"which benchmarks: {', '.join(BENCHES)} (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    unknown = [b for b in args.bench if b not in BENCHES]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHES)}")
    for name in args.bench or BENCHES:
        print(f"== {name}: {BENCHES[name].__doc__}", flush=True)
        BENCHES[name](args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
