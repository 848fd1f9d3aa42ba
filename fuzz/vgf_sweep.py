"""Mutation sweep of the VGF engine: damaged copies of valid VGF payloads (bits flipped in the header and in each
section, section offsets and sizes rewritten, bytes overwritten with boundary values, files cut) through the
container check (``parse_vgf``) and, when it passes, Arm's ML SDK stack in the engine's child process.

    python fuzz/vgf_sweep.py --cases 2000            # make fuzz runs this

A case is fine when it returns outputs or raises TosakitError within SLOW_SECONDS: a crash of the stack is the
child's, which the parent reports as an error. Anything else (another exception in this process, a hang past
the deadline) is a finding, written to fuzz/findings/ with what happened; the exit status is 1 if there is any.
"""

from __future__ import annotations

import argparse
import random
import struct
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEADLINE_SECONDS = 10.0  # one case's run on the stack
SLOW_SECONDS = 12.0
SEEDS = ("add", "add3", "softmax", "ds_cnn")
INTERESTING = [0, 1, 2, 4, 7, 8, 15, 16, 64, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000,
               0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]


def seeds() -> list[tuple[str, bytes, list[np.ndarray], list]]:
    """(name, VGF payload, its inputs as stored, its outputs' (dtype, shape)) of each seed model."""
    from tosakit.flow import compile
    from tosakit.runtime.tosa_inprocess import run_tosa
    from tosakit.specs import VgfCompileSpec
    from tosakit.zoo import MODELS

    found = []
    for name in SEEDS:
        model, inputs = MODELS[name].factory()
        quantize = name == "ds_cnn"
        compiled = compile(model, inputs, VgfCompileSpec(), quantize=quantize, calibration=[inputs])
        module = compiled.edge.program.graph_module.lowered_module_0
        arrays = [x.detach().permute(tuple(o)).contiguous().numpy()
                  for x, o in zip(_delegate_inputs(compiled, inputs), module.input_orders)]
        outputs = [(o.dtype, o.shape) for o in run_tosa(module.tosa, arrays)]
        found.append((name, module.processed_bytes, arrays, outputs))
    return found


def _delegate_inputs(compiled, inputs) -> tuple:
    from tosakit.runtime.delegates import _DelegateInputs

    runner = _DelegateInputs(compiled.edge.program.graph_module)
    runner.run(*inputs)
    return runner.seen[0][2]


def mutate(blob: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One damaged copy of ``blob`` and how it was damaged."""
    data = bytearray(blob)
    kind = rng.choice(["flip-header", "flip", "flip-many", "section", "value", "cut", "grow"])
    if kind == "flip-header":
        at = rng.randrange(128)
        data[at] ^= 1 << rng.randrange(8)
    elif kind in ("flip", "flip-many"):
        for _ in range(1 if kind == "flip" else rng.randrange(2, 64)):
            at = rng.randrange(128, len(data))
            data[at] ^= 1 << rng.randrange(8)
    elif kind == "section":
        slot = 16 + 8 * rng.randrange(8)
        old = struct.unpack_from("<Q", data, slot)[0]
        struct.pack_into("<Q", data, slot, rng.choice([0, old + 4, max(0, old - 4), old * 2, len(data), 1 << 40]))
    elif kind == "value":
        at = rng.randrange(128, len(data) - 4) & ~3
        struct.pack_into("<I", data, at, rng.choice(INTERESTING))
    elif kind == "cut":
        del data[rng.randrange(128, len(data)):]
    else:
        data += bytes(rng.randrange(1, 256))
    return kind, bytes(data)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-v", action="store_true", help="print each error")
    args = parser.parse_args()
    from tosakit.errors import TosakitError
    from tosakit.runtime.vgf import VgfEngine, find_stack, parse_vgf

    try:
        stack = find_stack()
    except TosakitError as exc:
        print(f"vgf sweep: not run: {exc}")
        return 2
    rng, outcomes, findings = random.Random(args.seed), Counter(), []
    cases = seeds()
    engine, start = None, time.monotonic()
    for k in range(args.cases):
        name, blob, inputs, outputs = cases[k % len(cases)]
        kind, data = mutate(blob, rng)
        began = time.monotonic()
        try:
            parse_vgf(data)
            engine = engine if engine is not None and engine.proc.poll() is None else VgfEngine(stack, 0.0)
            engine.deadline = time.monotonic() + DEADLINE_SECONDS
            engine.io_counts(data, name)
            engine.run(data, inputs, outputs, name)
            outcome = "ran"
        except TosakitError as exc:
            if "-v" in sys.argv: print(kind, exc.message[:150])
            outcome = "refused by the container check" if "VGF" in exc.message and "payload" in exc.message else (
                "stack stopped" if "stopped" in exc.message else "error")
            if "time limit" in exc.message:
                engine = None
        except Exception:  # noqa: BLE001  (the finding)
            outcome = "FINDING"
            findings.append((name, kind, traceback.format_exc()))
        if time.monotonic() - began > SLOW_SECONDS:
            findings.append((name, kind, f"took {time.monotonic() - began:.1f} s"))
        outcomes[outcome] += 1
        if (k + 1) % 200 == 0:
            print(f"{k + 1} cases, {time.monotonic() - start:.0f} s: {dict(outcomes)}", flush=True)
    if engine is not None:
        engine.close()
    print(f"vgf sweep: {args.cases} damaged payloads in {time.monotonic() - start:.0f} s: {dict(outcomes)}; "
          f"{len(findings)} finding(s)")
    if findings:
        out = HERE / "findings"
        out.mkdir(exist_ok=True)
        for j, (name, kind, what) in enumerate(findings):
            (out / f"vgf-{name}-{j}.txt").write_text(f"{kind}\n{what}")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
