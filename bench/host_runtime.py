"""The host runtime's speed: mv2's Ethos-U delegate on tosakit's simulator and its VGF delegate on the vgf engine,
each beside tosa_reference_model on the same TOSA and input (``make bench -- host-runtime``)."""

from __future__ import annotations

import statistics
import time


def _median_seconds(fn, repeats: int) -> float:
    def timed() -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    return statistics.median([timed() for _ in range(repeats)])


def host_runtime(args) -> None:
    """mv2 for ethos-u55-128 and ethos-u85-256: its Ethos-U delegate's command stream on tosakit's simulator
    beside tosa_reference_model on the TOSA it was compiled from (the same int8 input), and `tosakit run` of the
    whole .pte on each engine; the simulator's outputs are checked bit-exact against the reference model's first."""
    for target in ("ethos-u55-128", "ethos-u85-256"):
        _host_runtime(target, args.repeats)
    _host_runtime_vgf(args.repeats)


def _host_runtime_vgf(repeats: int) -> None:
    """mv2 int8 for vgf: its VGF payload on Arm's ML SDK stack (the vgf engine's child process) beside
    tosa_reference_model on the TOSA it was converted from, the same int8 input; outputs checked bit-exact first."""
    import numpy as np

    from tosakit.errors import TosakitError
    from tosakit.flow import compile
    from tosakit.program import LoweredBackendModule
    from tosakit.quantize.qdq import is_quantize, qparams_of
    from tosakit.runtime import run_tosa
    from tosakit.runtime.vgf import VgfEngine, find_stack
    from tosakit.specs import VgfCompileSpec
    from tosakit.zoo.mobilenet_v2 import build

    try:
        stack = find_stack()
    except TosakitError as exc:
        print(f"vgf: not measured: {exc}")
        return
    model, inputs = build()
    compiled = compile(model, inputs, VgfCompileSpec(), quantize=True)
    gm = compiled.edge.program.graph_module
    [delegate] = [m for m in gm.children() if isinstance(m, LoweredBackendModule)]
    int8 = qparams_of(next(n for n in gm.graph.nodes if is_quantize(n))).quantize(inputs[0]).numpy()
    reference = run_tosa(delegate.tosa, [int8])
    expected = [(r.dtype, r.shape) for r in reference]
    engine = VgfEngine(stack, time.monotonic() + 3600)
    try:
        start = time.perf_counter()
        got = engine.run(delegate.processed_bytes, [int8], expected, "mv2 vgf")
        setup = time.perf_counter() - start  # the child starting, the pipeline built, the first inference
        again = _median_seconds(lambda: engine.run(delegate.processed_bytes, [int8], expected, "mv2 vgf"), repeats)
    finally:
        engine.close()
    same = all(np.array_equal(g, r) for g, r in zip(got, reference))
    alone = _median_seconds(lambda: run_tosa(delegate.tosa, [int8]), repeats)
    print(f"vgf: the VGF engine's outputs equal the reference model's bit for bit: {same}")
    print(f"mv2, vgf ({len(delegate.processed_bytes)} VGF bytes), median of {repeats}")
    for label, seconds in (("vgf engine, setup and first run", setup), ("vgf engine, run again", again),
                           ("tosa_reference_model on the TOSA", alone)):
        print(f"  {label:<42}{seconds:>8.3f} s{seconds / alone:>8.2f}x the reference model")
    print(f"goal: vgf engine run again no slower than the reference model: {'met' if again <= alone else 'NOT met'} "
          f"({again / alone:.2f}x)")


def _host_runtime(target: str, repeats: int) -> None:
    import numpy as np

    from tosakit.backends.ethosu.payload import parse_payload
    from tosakit.flow import compile
    from tosakit.program import LoweredBackendModule
    from tosakit.quantize.qdq import is_quantize, qparams_of
    from tosakit.runtime import LoadedProgram, run_tosa
    from tosakit.runtime.ethosu import weights
    from tosakit.runtime.ethosu.simulate import simulate
    from tosakit.runtime.ethosu.system import compile_flags
    from tosakit.specs import EthosUCompileSpec
    from tosakit.zoo.mobilenet_v2 import build

    model, inputs = build()
    compiled = compile(model, inputs, EthosUCompileSpec(target).with_debug_info(), quantize=True)
    gm = compiled.edge.program.graph_module
    [delegate] = [m for m in gm.children() if isinstance(m, LoweredBackendModule)]
    payload = parse_payload(delegate.processed_bytes)
    int8 = qparams_of(next(n for n in gm.graph.nodes if is_quantize(n))).quantize(inputs[0]).numpy()
    flat = [int8.reshape(payload.inputs[0].shape)]  # the TOSA's input bytes, as the I/O table lists them

    def cold():
        weights.clear_caches()  # nothing decoded yet: a program's first run
        return simulate(payload, flat)

    reference = run_tosa(delegate.tosa, [int8])
    simulated = cold().outputs
    same = all(np.array_equal(s.reshape(-1), r.reshape(-1)) for s, r in zip(simulated, reference))
    print(f"{target}: simulated outputs equal the reference model's bit for bit: {same}")
    first = _median_seconds(cold, repeats)
    again = _median_seconds(lambda: simulate(payload, flat), repeats)
    flags = compile_flags(delegate.compile_specs)
    profiled = _median_seconds(lambda: simulate(payload, flat, profile=flags), repeats)
    alone = _median_seconds(lambda: run_tosa(delegate.tosa, [int8]), repeats)
    programs = {engine: LoadedProgram(compiled.program.buffer, "mv2.pte", engine=engine) for engine in ("npu", "tosa")}
    for program in programs.values():
        program.run(list(inputs))  # warm up (the isolated child starts once)
    whole = {engine: _median_seconds(lambda p=p: p.run(list(inputs)), repeats) for engine, p in programs.items()}
    print(f"mv2, {target} ({len(payload.cmd_data) // 4} command words, {len(payload.weight_data)} weight bytes), "
          f"median of {repeats}")
    rows = [("simulator, first run (decodes weights)", first), ("simulator, run again", again),
            ("simulator, run again, profiled (--profile)", profiled),
            ("tosa_reference_model on the TOSA", alone),
            ("tosakit run .pte --engine npu", whole["npu"]), ("tosakit run .pte --engine tosa", whole["tosa"])]
    for label, seconds in rows:
        print(f"  {label:<42}{seconds:>8.3f} s{seconds / alone:>8.2f}x the reference model")
    print(f"goal: simulator no slower than the reference model: {'met' if max(first, again) <= alone else 'NOT met'} "
          f"(run again {again / alone:.2f}x, first run {first / alone:.2f}x)")
    print(f"goal: profiling costs at most 25% over a plain run: {'met' if profiled <= 1.25 * again else 'NOT met'} "
          f"({profiled / again:.2f}x)")
