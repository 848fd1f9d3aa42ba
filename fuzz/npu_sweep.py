"""Mutation sweep of the Ethos-U command-stream simulator: damaged copies of valid delegate payloads (command
words: bits, cmd1 data words, cmd0 parameters, codes, cuts, moved commands; weight bytes; the I/O table;
the scratch size) through ``parse_payload`` and ``simulate()``. Cases run in batches in child processes,
each case's result sent back before the next starts, so a crash or an exit (Vela's weight codec is native
code), a hang or runaway memory is pinned on the case that caused it.

    python fuzz/npu_sweep.py --cases 8000 --jobs 2            # make fuzz runs this
    python fuzz/npu_sweep.py --replay fuzz/findings/npu-digits_u55_128-17.bin   # one case, in this process

A case is fine when it returns outputs or raises TosakitError within SLOW_SECONDS and PEAK_LIMIT_MB; any
other exception, a crash, an exit, a hang, more time or memory is a finding, written to fuzz/findings/
(the payload and what happened). The exit status is 1 if there is any.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import resource
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, deque
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DEADLINE_SECONDS = 2.0  # the deadline simulate() is given
MAX_MEMORY = 256 << 20  # the memory limit simulate() is given (its regions, as tosakit run --max-memory 256M)
SLOW_SECONDS = 5.0  # a case taking longer (it overran its deadline by 3 s) is a finding
HANG_SECONDS = 60.0  # a batch silent this long is killed: its current case hung
PEAK_LIMIT_MB = 500  # the case process's peak resident memory
ADDRESS_LIMIT = 8 << 30  # address space a case process may add to what it maps at start (guards the machine)
INPUT_LIMIT = 16 << 20  # bytes of inputs made for a case; past it the table's shape gets a mismatched array
BATCH = 50
INTERESTING = [0, 1, 2, 3, 7, 8, 15, 16, 64, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFF, 0x10000, 1 << 20,
               1 << 24, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]
DA_CMD_STREAM = 0x02  # the driver action that holds the command stream (see commands.py)


# ------------------------------------------------------------------ mutations


class Parts:
    """A delegate payload taken apart for editing: cmd_data as 32-bit words (then ``tail``, the bytes of a
    partial word), weight bytes, scratch size, and the I/O table as [shape, elem_size, offset, region] lists."""

    def __init__(self, blob: bytes):
        from tosakit.backends.ethosu.payload import parse_payload

        p = parse_payload(blob)
        whole = len(p.cmd_data) // 4
        self.words = list(struct.unpack(f"<{whole}I", p.cmd_data[:4 * whole]))
        self.tail = p.cmd_data[4 * whole:]
        self.weights = bytearray(p.weight_data)
        self.scratch = p.scratch_size
        self.tables = {k: [[list(t.shape), t.elem_size, t.offset, t.region] for t in getattr(p, k)]
                       for k in ("inputs", "outputs")}

    def stream(self) -> tuple[int, int] | None:
        """The word index of the command-stream action and its length in words, if the header holds one."""
        i = 1
        while i < len(self.words):
            action = self.words[i] & 0xFF
            if action == DA_CMD_STREAM:
                return i, ((self.words[i] >> 8) & 0xFF) << 16 | self.words[i] >> 16
            i += 3 if action == 0x01 else 1
        return None

    def set_stream_length(self, at: int, length: int) -> None:
        self.words[at] = DA_CMD_STREAM | ((length >> 16) & 0xFF) << 8 | (length & 0xFFFF) << 16

    def commands(self) -> list[tuple[int, bool]]:
        """(word index, cmd1) of each command of the stream, as far as the words go."""
        found = self.stream()
        if found is None:
            return []
        at, length = found
        out, i, end = [], at + 1, min(len(self.words), at + 1 + length)
        while i < end:
            cmd1 = bool(self.words[i] & 0x4000)
            out.append((i, cmd1))
            i += 2 if cmd1 else 1
        return out

    def pack(self) -> bytes:
        from tosakit.backends.ethosu.payload import pack_payload
        from tosakit.backends.ethosu.vela import VelaResult, VelaTensor

        cmd = struct.pack(f"<{len(self.words)}I", *self.words) + self.tail
        tensors = {k: [VelaTensor(tuple(s), e, o, r) for s, e, o, r in v] for k, v in self.tables.items()}
        return pack_payload(VelaResult(cmd, bytes(self.weights), self.scratch, 0, tensors["inputs"],
                                       tensors["outputs"], None))


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def _value(old: int, rng: random.Random, bits: int) -> int:
    """A replacement for ``old``: an interesting value, a neighbour, a flipped bit or random."""
    mask = (1 << bits) - 1
    kind = rng.randrange(4)
    if kind == 0:
        return rng.choice(INTERESTING) & mask
    if kind == 1:
        return (old + rng.choice((-1, 1, -16, 16, 256, -256, old))) & mask
    if kind == 2:
        return old ^ (1 << rng.randrange(bits))
    return rng.getrandbits(bits)


def _cmd_bit(p: Parts, rng) -> str | None:
    """One bit of a command-stream word (of a header word one time in seven)."""
    if not p.words:
        return None
    cmds = p.commands()
    i = rng.randrange(len(p.words)) if not cmds or rng.random() < 1 / 7 else rng.choice(cmds)[0]
    p.words[i] ^= 1 << rng.randrange(32)
    return "cmd bit"


def _cmd_data(p: Parts, rng) -> str | None:
    """The data word of a cmd1 (an address, length, stride or scale)."""
    cmd1 = [i for i, has in p.commands() if has and i + 1 < len(p.words)]
    if not cmd1:
        return None
    i = rng.choice(cmd1) + 1
    p.words[i] = _value(p.words[i], rng, 32)
    return "cmd1 data"


def _cmd_param(p: Parts, rng) -> str | None:
    """The 16-bit parameter of a command (a size minus one, a mode, a region, ...)."""
    cmds = p.commands()
    if not cmds:
        return None
    i = rng.choice(cmds)[0]
    p.words[i] = (p.words[i] & 0xFFFF) | _value(p.words[i] >> 16, rng, 16) << 16
    return "cmd param"


def _cmd_code(p: Parts, rng) -> str | None:
    """A command's code: another register's, cmd0 and cmd1 swapped, or any 16 bits."""
    from tosakit.runtime.ethosu.registers import U55

    cmds = p.commands()
    if not cmds:
        return None
    i = rng.choice(cmds)[0]
    kind = rng.randrange(3)
    code = rng.choice(list(U55)) if kind == 0 else (p.words[i] & 0xFFFF) ^ 0x4000 if kind == 1 else rng.getrandbits(16)
    p.words[i] = (p.words[i] & 0xFFFF0000) | code
    return "cmd code"


def _cmd_cut(p: Parts, rng) -> str | None:
    """cmd_data cut short: at a word (the header's stream length kept, or fixed to fit), or mid-word."""
    found = p.stream()
    if len(p.words) < 2:
        return None
    keep = rng.randrange(1, len(p.words))
    if rng.random() < 0.2:
        p.tail = struct.pack("<I", p.words[keep])[:rng.randrange(1, 4)]
        del p.words[keep:]
        return "cmd cut mid-word"
    del p.words[keep:]
    p.tail = b""
    if found is not None and found[0] < keep and rng.random() < 0.5:
        p.set_stream_length(found[0], keep - found[0] - 1)
        return "cmd cut, length fixed"
    return "cmd cut"


def _cmd_move(p: Parts, rng) -> str | None:
    """One command deleted, duplicated or moved elsewhere (the stream length fixed)."""
    cmds, found = p.commands(), p.stream()
    if len(cmds) < 2:
        return None
    k = rng.randrange(len(cmds))
    i, cmd1 = cmds[k]
    words = p.words[i: i + (2 if cmd1 else 1)]
    kind = rng.randrange(3)
    if kind != 1:
        del p.words[i: i + len(words)]
    if kind != 0:
        at = rng.choice(p.commands() or cmds)[0]
        p.words[at:at] = words
    p.set_stream_length(found[0], found[1] + (len(words) if kind == 1 else -len(words) if kind == 0 else 0))
    return ("cmd deleted", "cmd duplicated", "cmd moved")[kind]


def _weight_bytes(p: Parts, rng) -> str | None:
    """weight_data (the weight, bias and scale streams): bits, bytes, runs of 0 or 0xFF, a cut, an insert."""
    w = p.weights
    if not w:
        return None
    pos, kind = rng.randrange(len(w)), rng.randrange(6)
    if kind == 0:
        w[pos] ^= 1 << rng.randrange(8)
    elif kind == 1:
        w[pos] = rng.randrange(256)
    elif kind in (2, 3):
        n = rng.randrange(1, 64)
        w[pos:pos + n] = bytes([0 if kind == 2 else 0xFF]) * len(w[pos:pos + n])
    elif kind == 4:
        del w[pos:]
    else:
        w[pos:pos] = rng.randbytes(rng.randrange(1, 64))
    return ("weight bit", "weight byte", "weight zeros", "weight 0xff", "weight cut", "weight insert")[kind]


def _io_table(p: Parts, rng) -> str | None:
    """An I/O-table entry: a shape dimension, the element size, the offset or the region; or an entry
    dropped or repeated."""
    which = rng.choice(("inputs", "outputs"))
    table = p.tables[which]
    if not table:
        return None
    t = rng.choice(table)
    kind = rng.randrange(6)
    if kind == 0:
        d = rng.randrange(6)
        t[0][d] = _int32(rng.choice((0, 2, -1, 65536, 1 << 20, 1 << 30, t[0][d] * 2, t[0][d] + 1)))
    elif kind == 1:
        t[1] = rng.choice((1, 2, 4))
    elif kind == 2:
        t[2] = _int32(_value(t[2] & 0xFFFFFFFF, rng, 32))
    elif kind == 3:
        t[3] = _int32(rng.choice((0, 1, 2, 3, 7, -1, 1 << 31)))
    elif kind == 4:
        table.remove(t)
    else:
        table.append([list(t[0]), *t[1:]])
    return f"{which[:-1]} " + ("shape", "elem size", "offset", "region", "dropped", "repeated")[kind]


def _scratch_size(p: Parts, rng) -> str:
    """The scratch size: smaller, zero, larger, or the u32's end."""
    p.scratch = rng.choice((0, p.scratch // 2, max(0, p.scratch - 1), p.scratch + 16, 1 << 20,
                            rng.getrandbits(32), 0xFFFFFFFF)) & 0xFFFFFFFF
    return "scratch size"


# (mutator, weight): most damage lands in the command stream, where the simulator's logic is
MUTATORS = [(_cmd_bit, 12), (_cmd_data, 14), (_cmd_param, 14), (_cmd_code, 6), (_cmd_cut, 4), (_cmd_move, 6),
            (_weight_bytes, 20), (_io_table, 16), (_scratch_size, 4)]


def mutate(blob: bytes, rng: random.Random) -> tuple[bytes, list[str]]:
    """One damaged copy of a valid payload ``blob`` (1 to 3 mutations) and the names of its mutations."""
    parts, done = Parts(blob), []
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        fn = rng.choices([m for m, _ in MUTATORS], [w for _, w in MUTATORS])[0]
        name = fn(parts, rng)
        if name:
            done.append(name)
    return parts.pack(), done


def case(seeds: list[bytes], index: int, seed: int) -> tuple[bytes, list[str]]:
    """Case ``index``'s damaged payload (of seed payload ``index % len(seeds)``) and its mutations."""
    return mutate(seeds[index % len(seeds)], random.Random(seed * 1_000_003 + index))


# ------------------------------------------------------------------ one case


def inputs_for(payload) -> list[np.ndarray]:
    """Seeded integers of each input's table shape; a 16-element array where the shape is negative, larger
    than INPUT_LIMIT, or has a dimension past it (an empty shape numpy cannot make; the simulator must refuse
    the mismatch)."""
    rng = np.random.default_rng(0)
    out = []
    for t in payload.inputs:
        dtype = np.dtype(f"<i{t.elem_size}")
        if min(t.shape) < 0 or max(t.shape) > INPUT_LIMIT or math.prod(t.shape) * t.elem_size > INPUT_LIMIT:
            out.append(np.zeros(16, dtype))
        else:
            info = np.iinfo(dtype)
            out.append(rng.integers(info.min, info.max, size=t.shape, dtype=dtype, endpoint=True))
    return out


def execute(blob: bytes):
    """``blob`` parsed and simulated on its seeded inputs, with a deadline DEADLINE_SECONDS away."""
    from tosakit.backends.ethosu.payload import parse_payload
    from tosakit.runtime.ethosu.simulate import simulate

    payload = parse_payload(blob)
    return simulate(payload, inputs_for(payload), deadline=time.monotonic() + DEADLINE_SECONDS,
                    max_memory=MAX_MEMORY)


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the peak resident memory, to the current
    except OSError:
        pass  # then VmHWM is the process's peak so far: an over-estimate, never missed


def _peak_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1)) / 1024
    except (OSError, AttributeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_case(blob: bytes) -> dict:
    """One case in this process: outcome ("ran", "refused", "deadline" or "exception"), the exception's kind,
    message and (for foreign ones) where it was raised, seconds and peak resident MB."""
    from tosakit.errors import TosakitError, first_line

    _reset_peak()
    start = time.monotonic()
    result = {"outcome": "ran", "kind": "", "message": "", "where": ""}
    try:
        result["message"] = f"{len(execute(blob).operations)} operations"
    except TosakitError as exc:
        deadline = "ran past its time limit" in exc.message
        result.update(outcome="deadline" if deadline else "refused", kind=type(exc).__name__, message=first_line(exc))
    except Exception as exc:  # noqa: BLE001  (escaping simulate() is the finding)
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        result.update(outcome="exception", kind=type(exc).__name__, message=first_line(exc),
                      where=f"{frame.filename}:{frame.lineno} in {frame.name}")
    return {**result, "seconds": time.monotonic() - start, "peak_mb": _peak_mb()}


def child() -> None:
    """A batch process: read {seeds, seed, cases} from stdin, write one JSON line per case to stdout as each
    ends (native code's own prints go to stderr, where a death's last words are read, not into the results)."""
    spec = json.load(sys.stdin)
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    seeds = [Path(p).read_bytes() for p in spec["seeds"]]
    execute(seeds[0])  # imports and first-use allocations before the limit and the first measured case
    with open("/proc/self/statm") as f:
        mapped = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (mapped + ADDRESS_LIMIT, mapped + ADDRESS_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for index in spec["cases"]:
        blob, _ = case(seeds, index, spec["seed"])
        results.write(json.dumps({"case": index, **run_case(blob)}) + "\n")


# ------------------------------------------------------------------ the sweep


class Batch:
    """A child process running some cases; what it has reported so far."""

    def __init__(self, cases: list[int], seeds: list[Path], seed: int, scratch: Path):
        self.cases, self.reported, self.last = cases, 0, time.monotonic()
        self.stderr = scratch / f"batch{cases[0]}.stderr"
        with open(self.stderr, "wb") as err:
            # One BLAS and OpenMP thread per case process (set for the child only: importing this module
            # must not change the thread count of the process that imports it, a test run's worker).
            env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
            self.proc = subprocess.Popen([sys.executable, __file__, "--child"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, env=env)
        self.proc.stdin.write(json.dumps({"seeds": [str(p) for p in seeds], "seed": seed, "cases": cases}).encode())
        self.proc.stdin.close()

    def end(self, hung: bool) -> tuple[int, str, list[int]] | None:
        """After its output ended (or it hung and is killed): the case that killed it, what happened, and
        the cases it did not reach; None if it ran them all."""
        if hung:
            self.proc.kill()
        code = self.proc.wait()
        self.proc.stdout.close()
        if self.reported == len(self.cases) and code == 0:
            return None
        tail = self.stderr.read_text(errors="replace").strip().splitlines()[-1:]
        what = ("hang" if hung else f"crash ({signal.Signals(-code).name})" if code < 0 else f"exit {code}")
        culprit = min(self.reported, len(self.cases) - 1)  # past the last case: it died on its way out
        return self.cases[culprit], what + (f": {tail[0][:200]}" if tail and not hung else ""), \
            self.cases[culprit + 1:]


def judge(result: dict) -> str | None:
    """What is wrong with a reported case, or None."""
    if result["outcome"] == "exception":
        kind = "memory" if result["kind"] == "MemoryError" else "exception"
        return f"{kind} ({result['kind']}: {result['message'][:160]} at {result['where']})"
    if result["seconds"] > SLOW_SECONDS:
        return f"slow ({result['seconds']:.1f} s, {result['outcome']}: {result['message'][:120]})"
    if result["peak_mb"] > PEAK_LIMIT_MB:
        return f"memory ({result['peak_mb']:.0f} MB, {result['outcome']}: {result['message'][:120]})"
    return None


def sweep(seeds: list[Path], cases: int, jobs: int, seed: int = 0, seconds: float | None = None,
          findings: Path | None = None, progress: bool = True) -> dict:
    """Run up to ``cases`` damaged payloads spread over ``seeds`` (stopping after ``seconds``); a summary."""
    start = time.monotonic()
    queue = deque(list(range(i, min(i + BATCH, cases))) for i in range(0, cases, BATCH))
    running: list[Batch] = []
    results: dict[int, dict] = {}
    scratch = Path(tempfile.mkdtemp(prefix="tosakit-npu-sweep-"))
    try:
        while queue or running:
            while queue and len(running) < jobs and (seconds is None or time.monotonic() - start < seconds):
                running.append(Batch(queue.popleft(), seeds, seed, scratch))
            if not running:
                break
            ready = select.select([b.proc.stdout for b in running], [], [], 1.0)[0]
            for b in list(running):
                line = b.proc.stdout.readline() if b.proc.stdout in ready else None
                if line:
                    result = json.loads(line)
                    results[result["case"]] = result
                    b.reported, b.last = b.reported + 1, time.monotonic()
                    if progress and len(results) % 500 == 0:
                        found = sum(judge(r) is not None for r in results.values())
                        print(f"  {len(results)}/{cases} payloads, {found} finding(s)", flush=True)
                    continue
                hung = line is None and time.monotonic() - b.last > HANG_SECONDS
                if line is None and not hung:
                    continue
                running.remove(b)
                ended = b.end(hung)
                if ended is not None:
                    culprit, what, rest = ended
                    results[culprit] = {"case": culprit, "outcome": "died", "problem": what, "kind": "",
                                        "message": what, "seconds": time.monotonic() - b.last, "peak_mb": 0.0}
                    if rest:
                        queue.appendleft(rest)
    finally:
        for b in running:
            b.proc.kill()
            b.proc.wait()
        for path in scratch.iterdir():
            path.unlink()
        scratch.rmdir()
    return _summary(seeds, seed, results, time.monotonic() - start, findings)


def _summary(seeds: list[Path], seed: int, results: dict[int, dict], elapsed: float, findings: Path | None) -> dict:
    blobs = [p.read_bytes() for p in seeds]
    problems = []
    for index, r in sorted(results.items()):
        r["seed"] = seeds[index % len(seeds)].stem
        r["problem"] = r.get("problem") or judge(r)
        if r["problem"]:
            blob, r["mutations"] = case(blobs, index, seed)
            problems.append(r)
            if findings is not None:
                findings.mkdir(parents=True, exist_ok=True)
                stem = findings / f"npu-{r['seed']}-{index}"
                stem.with_suffix(".bin").write_bytes(blob)
                stem.with_suffix(".json").write_text(json.dumps(r, indent=1))
    measured = [r for r in results.values() if r["outcome"] != "died"]
    return {"cases": len(results), "seeds": [p.stem for p in seeds], "seconds": elapsed, "problems": problems,
            "outcomes": Counter(r["outcome"] for r in results.values()),
            "refusals": Counter(r["kind"] for r in results.values() if r["outcome"] in ("refused", "deadline")),
            "peak": max(measured, key=lambda r: r["peak_mb"], default=None),
            "slowest": max(measured, key=lambda r: r["seconds"], default=None)}


def report(summary: dict) -> str:
    """The sweep's figures and findings, for people."""
    o = summary["outcomes"]
    kinds = Counter(_kind(p["problem"]) for p in summary["problems"])
    distinct = Counter(_signature(p["problem"]) for p in summary["problems"])
    example = {_signature(p["problem"]): p for p in reversed(summary["problems"])}
    lines = [f"{summary['cases']} damaged payloads of {len(summary['seeds'])} seeds in {summary['seconds']:.0f} s: "
             f"ran {o['ran']}, refused {o['refused'] + o['deadline']} with TosakitError ({o['deadline']} at the "
             f"deadline), {o['exception']} foreign exceptions, {o['died']} died",
             "refusals by kind: " + ", ".join(f"{k} {n}" for k, n in summary["refusals"].most_common())]
    for label, key, unit in (("peak memory", "peak", "peak_mb"), ("slowest case", "slowest", "seconds")):
        r = summary[key]
        if r is not None:
            figure = f"{r[unit]:.0f} MB" if unit == "peak_mb" else f"{r[unit]:.2f} s"
            lines.append(f"{label}: {figure} (case {r['case']}, {r['seed']}: {r['outcome']} {r['message'][:100]})")
    lines.append(f"findings: {len(summary['problems'])} " + (f"({dict(kinds)})" if kinds else
                                                             "(0 crashes, 0 hangs, 0 foreign exceptions)"))
    for signature, n in distinct.most_common():
        p = example[signature]
        lines.append(f"  {n} x {p['problem']}\n      e.g. case {p['case']} ({p['seed']}; {', '.join(p['mutations'])})")
    return "\n".join(lines)


def _kind(problem: str) -> str:
    """"crash", "exit 1", "hang", "memory", "slow" or "exception"."""
    return re.match(r"exit \d+|\w+", problem).group(0)


def _signature(problem: str) -> str:
    """A finding without its figures: the same bug hit by different cases."""
    return re.sub(r"\s+", " ", re.sub(r"\d+(\.\d+)?", "N", re.sub(r"0x[0-9a-f]+", "N", problem)))[:120]


def replay(path: Path) -> int:
    """Run one payload file in this process, letting any foreign exception show its traceback."""
    from tosakit.errors import TosakitError

    try:
        sim = execute(path.read_bytes())
    except TosakitError as exc:
        print(f"refused ({type(exc).__name__}): {exc}")
        return 0
    print(f"ran {len(sim.operations)} operations; outputs {[o.shape for o in sim.outputs]}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=8000)
    ap.add_argument("--seconds", type=float, help="stop starting batches after this many seconds")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds-dir", type=Path, default=HERE / "corpus" / "npu-seeds")
    ap.add_argument("--findings", type=Path, default=HERE / "findings")
    ap.add_argument("--replay", type=Path, help="run one payload file (a finding) in this process")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child()
        return 0
    if args.replay:
        return replay(args.replay)
    sys.path.insert(0, str(HERE))
    from seeds import build_npu_seeds

    summary = sweep(build_npu_seeds(args.seeds_dir), args.cases, args.jobs, args.seed, args.seconds, args.findings)
    print(report(summary))
    return 1 if summary["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
