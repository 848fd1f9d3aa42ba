"""Mutation sweep: damaged copies of valid programs through `tosakit run` and `tosakit inspect`, each in
its own (forked) process, watched for crashes, hangs, foreign exceptions, stray output files and memory.

    python fuzz/sweep.py --cases 8000 --jobs 2        # make fuzz runs this at full size

Every case must end with exit 0, or exit 2 and one `error:` line (plus its `fix:` line) with nothing
written. Findings are copied to fuzz/findings/ with what happened; the exit status is 1 if any.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
PEAK_LIMIT_MB = 500
CASE_TIMEOUT = 60.0  # seconds before a case counts as a hang (the run itself is told --timeout 20)
INTERESTING = [0, 1, 2, 0x7F, 0x80, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 16, 64, 1 << 20]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One damaged copy: bit flips, random or 'interesting' words, zeroed pairs, cuts, splices."""
    b = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 3, 8))):
        kind = rng.randrange(7)
        # half the damage lands in the flatbuffer program (its first KiB holds the tables), half anywhere
        pos = rng.randrange(min(len(b), 1024) if rng.random() < 0.5 else len(b)) if b else 0
        if not b:
            break
        if kind == 0:
            b[pos] ^= 1 << rng.randrange(8)
        elif kind == 1:
            b[pos] = rng.randrange(256)
        elif kind == 2 and pos + 4 <= len(b):
            struct.pack_into("<I", b, pos - pos % 4, rng.choice(INTERESTING) & 0xFFFFFFFF)
        elif kind == 3 and pos + 2 <= len(b):
            b[pos:pos + 2] = b"\0\0"
        elif kind == 4:
            del b[pos:]
        elif kind == 5:
            n = rng.randrange(1, 64)
            b[pos:pos] = b[rng.randrange(len(b)):][:n]
        else:
            del b[pos:pos + rng.randrange(1, 64)]
    return bytes(b)


def _child(argv: list[str], out: Path, err: Path) -> None:
    """Inside the forked case process: run the CLI with its output in files, exit with its status."""
    code = 98
    try:
        os.dup2(os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 1)
        os.dup2(os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), 2)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
        from tosakit.cli import main

        code = main(argv)
    except BaseException as exc:  # noqa: BLE001  (escaping main() is itself the finding)
        print(f"escaped: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 97
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_case(argv: list[str], work: Path) -> dict:
    """Fork, run, wait (killing a hang): exit status or signal, peak memory, seconds, what was printed."""
    out, err = work / "stdout", work / "stderr"
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(argv, out, err)
    status, usage, hung = 0, None, False
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - start > CASE_TIMEOUT:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            hung = True
            break
        time.sleep(0.005)
    return {"exit": os.waitstatus_to_exitcode(status), "hung": hung, "peak_mb": usage.ru_maxrss / 1024,
            "seconds": time.monotonic() - start, "stderr": err.read_text(errors="replace"),
            "stdout": out.read_text(errors="replace")}


def judge(result: dict, wrote: bool, passed: tuple[int, ...] = (0,)) -> str | None:
    """What is wrong with a case's outcome, or None; ``passed``: the exit statuses of a run that ended well (a
    bundle's failed test case, 3, among them)."""
    if result["hung"]:
        return "hang"
    if result["exit"] < 0:
        return f"crash ({signal.Signals(-result['exit']).name})"
    if result["peak_mb"] > PEAK_LIMIT_MB:
        return f"memory ({result['peak_mb']:.0f} MB)"
    lines = result["stderr"].strip().splitlines()
    if result["exit"] in passed:
        return None if result["exit"] == 0 or not lines else f"exit {result['exit']} with errors: {lines[0][:160]}"
    if result["exit"] != 2:
        return f"exit {result['exit']}: {lines[0][:160] if lines else ''}"
    if not lines or not lines[0].startswith("error: ") or any(ln.startswith("error:") for ln in lines[1:]) \
            or len(lines) > 2:
        return f"not one error line: {result['stderr'][:160]!r}"
    if wrote:
        return "wrote its output despite the error"
    return None


def _case(task: tuple[int, str, int, str]) -> list[dict]:
    """One damaged file through run and inspect (in a pool worker; each command forked)."""
    index, seed_path, seed, scratch = task
    rng = random.Random(seed * 1_000_003 + index)
    data = mutate(Path(seed_path).read_bytes(), rng)
    work = Path(scratch) / f"case{index}"
    work.mkdir()
    bundled = seed_path.endswith(".bpte")  # a bundle runs its own test cases: PASS (0) or FAIL (3)
    pte, outputs = work / ("damaged.bpte" if bundled else "damaged.pte"), work / "out.npz"
    pte.write_bytes(data)
    found = []
    running = ["run", str(pte), "--timeout", "20"] + ([] if bundled else ["--random", "--outputs", str(outputs)])
    for argv in (running, ["inspect", str(pte)]):
        result = run_case(argv, work)
        problem = judge(result, outputs.exists() and result["exit"] != 0, (0, 3) if bundled else (0,))
        outputs.unlink(missing_ok=True)
        found.append({"case": index, "seed": Path(seed_path).stem, "command": argv[0], "problem": problem,
                      "exit": result["exit"], "peak_mb": result["peak_mb"], "seconds": result["seconds"],
                      "message": result["stderr"].strip().splitlines()[0][:200] if result["stderr"].strip() else "",
                      "data": data if problem else None})
    shutil.rmtree(work)
    return found


def _warm() -> None:
    """Pool workers import what a run needs once; each forked case then starts at once."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch  # noqa: F401
    from torch.ao.quantization.fx._decomposed import quantized_decomposed_lib  # noqa: F401  (the q/dq kernels)

    import tosakit.cli  # noqa: F401
    import tosakit.cli_commands  # noqa: F401
    import tosakit.runtime.execute  # noqa: F401
    import tosakit.runtime.io  # noqa: F401
    import tosakit.runtime.program  # noqa: F401


def sweep(seeds: list[Path], cases: int, jobs: int, seed: int = 0, findings: Path | None = None,
          progress: bool = True) -> dict:
    """Run ``cases`` damaged files spread over ``seeds``; a summary with every finding."""
    scratch = tempfile.mkdtemp(prefix="tosakit-sweep-")
    tasks = [(i, str(seeds[i % len(seeds)]), seed, scratch) for i in range(cases)]
    outcomes, problems, peak, slowest = Counter(), [], 0.0, 0.0
    try:
        # fresh workers (never forked from a process that ran torch: its OpenMP pool does not survive a fork)
        with multiprocessing.get_context("spawn").Pool(jobs, initializer=_warm) as pool:
            for k, results in enumerate(pool.imap_unordered(_case, tasks, chunksize=4), 1):
                for r in results:
                    outcomes[(r["command"], r["exit"])] += 1
                    peak, slowest = max(peak, r["peak_mb"]), max(slowest, r["seconds"])
                    if r["problem"]:
                        problems.append(r)
                if progress and (k % 200 == 0 or k == cases):
                    print(f"  {k}/{cases} files, {len(problems)} finding(s), peak {peak:.0f} MB", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if findings is not None and problems:
        findings.mkdir(parents=True, exist_ok=True)
        for p in problems:
            stem = f"{p['seed']}-{p['case']}-{p['command']}"
            (findings / f"{stem}.pte").write_bytes(p["data"])
            (findings / f"{stem}.json").write_text(json.dumps({k: v for k, v in p.items() if k != "data"}, indent=1))
    return {"cases": cases, "seeds": len(seeds), "outcomes": dict(outcomes), "problems": problems,
            "peak_mb": peak, "slowest_s": slowest}


def report(summary: dict) -> str:
    kinds = Counter((p["problem"].split(" ")[0]) for p in summary["problems"])
    ran = sum(n for (cmd, code), n in summary["outcomes"].items() if cmd == "run" and code == 0)
    refused = sum(n for (cmd, code), n in summary["outcomes"].items() if cmd == "run" and code == 2)
    lines = [f"{summary['cases']} damaged files from {summary['seeds']} programs: `run` ran {ran}, refused {refused} "
             f"with one error line; peak memory {summary['peak_mb']:.0f} MB per case, slowest {summary['slowest_s']:.1f} s",
             f"findings: {len(summary['problems'])} " + (f"({dict(kinds)})" if kinds else "(0 crashes, 0 hangs, "
                                                          "0 foreign exceptions)")]
    lines += [f"  case {p['case']} ({p['seed']}, {p['command']}): {p['problem']}" for p in summary["problems"][:20]]
    return "\n".join(lines)


def main() -> int:
    sys.path.insert(0, str(HERE))
    from seeds import build_seeds

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=8000)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds-dir", type=Path, default=HERE / "corpus" / "seeds")
    ap.add_argument("--findings", type=Path, default=HERE / "findings")
    args = ap.parse_args()
    seeds = build_seeds(args.seeds_dir)
    start = time.monotonic()
    summary = sweep(seeds, args.cases, args.jobs, args.seed, args.findings)
    print(report(summary))
    print(f"in {time.monotonic() - start:.0f} s")
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sys.exit(main())
