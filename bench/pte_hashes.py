"""The sha256 of every built-in model's ``.pte`` on each target, float and quantized: a refactoring that
changes no behaviour leaves this list byte for byte the same.

    python bench/pte_hashes.py -o before.txt            # at the old head
    python bench/pte_hashes.py -o after.txt --compare before.txt

Each program is compiled as ``tosakit compile -m NAME -t TARGET --delegate [--quantize]`` would (a float model
for Ethos-U, which runs integers only, without ``--delegate``), in worker processes (``-j``); a line is
``sha256  model  target  float|int8`` or the first line of the error.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("ethos-u55-128", "ethos-u85-256", "vgf", "TOSA-1.0+INT", "TOSA-1.0+FP")


def _jobs(models: list[str], targets: list[str]) -> list[tuple[str, str, bool]]:
    """(model, target, quantize) for every pair; TOSA-1.0+FP has no integer profile to quantize for."""
    return [(m, t, q) for m in models for t in targets for q in (False, True) if not (q and t.endswith("+FP"))]


def _one(job: tuple[str, str, bool]) -> str:
    import contextlib
    import io

    from tosakit.cli import main

    model, target, quantize = job
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.pte"
        delegate = quantize or not target.startswith("ethos-u")
        argv = ["compile", "-m", model, "-t", target, "-o", str(out), "--quiet"] + (["--delegate"] if delegate else [])
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(argv + (["--quantize"] if quantize else []))
        digest = hashlib.sha256(out.read_bytes()).hexdigest() if code == 0 and out.exists() else \
            f"error {code}: {(err.getvalue().strip().splitlines() or [''])[0]}".replace(str(ROOT), "<repo>")
    return f"{digest}  {model}  {target}  {'int8' if quantize else 'float'}"


def main() -> int:
    from tosakit.zoo import MODELS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", help="write the list here too")
    p.add_argument("--compare", help="a list written before: print the lines that differ, exit 1 if any")
    p.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--models", nargs="*", default=list(MODELS))
    p.add_argument("--targets", nargs="*", default=list(TARGETS))
    args = p.parse_args()
    jobs = _jobs(args.models, args.targets)
    start = time.perf_counter()
    lines = []
    with ProcessPoolExecutor(args.jobs) as pool:
        for i, line in enumerate(pool.map(_one, jobs), 1):
            print(f"[{i:3}/{len(jobs)} {time.perf_counter() - start:6.0f}s] {line}", flush=True)
            lines.append(line)
    text = "\n".join(lines) + "\n"
    if args.output:
        Path(args.output).write_text(text)
    print(f"{len(lines)} programs in {time.perf_counter() - start:.0f} s")
    if args.compare:
        ran = {line.split("  ", 1)[1] for line in lines}  # a subset (--models, --targets) compares its own rows
        before = [line for line in Path(args.compare).read_text().splitlines() if line.split("  ", 1)[1] in ran]
        differ = sorted(set(before) ^ set(lines))
        for line in differ:
            print(("before: " if line in before else "after:  ") + line)
        print(f"{len(lines) - len(set(lines) - set(before))} of {len(lines)} identical to {args.compare}")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
