"""The field sweep's tables, summary and plot, from its rows (bench/out/sweep/rows): printed, and written as
sweep.md (the README's table), summary.json and sweep.png (cycle ratio per network, by family)."""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
from dataclasses import dataclass
from pathlib import Path

GOALS = {"ethos-u55-128": 0.90, "ethos-u85-256": 0.75}  # the geometric-mean targets for cycles
BUCKETS = (0.5, 0.75, 0.9, 1.0, 1.1)
# pure data movement and dtype casts at a delegate's edge (ExecuTorch's _to_dim_order_copy of int64 ids, tosakit's
# _to_copy), left out of both compilers' CPU compute ops
MOVEMENT = {"squeeze", "unsqueeze", "view", "reshape", "permute", "clone", "expand", "alloc", "contiguous", "_to_copy",
            "_to_dim_order_copy"}


def compute_kinds(side: dict) -> dict[str, int]:
    """A side's CPU ops by name, data movement left out (names as recorded, a schema's tail cut)."""
    kinds: dict[str, int] = {}
    for name, count in side.get("cpu_kinds", {}).items():
        op = name.split("(")[0]
        if op not in MOVEMENT and not (op.endswith("_copy") and op[:-5] in MOVEMENT):
            kinds[op] = kinds.get(op, 0) + count
    return kinds


@dataclass
class Pair:
    """One network on one target: tosakit's and ExecuTorch's results."""

    spec: str
    family: str
    macs: int
    mine: dict
    theirs: dict

    @property
    def compiled(self) -> tuple[bool, bool]:
        return "error" not in self.mine, "error" not in self.theirs

    def cpu(self, side: dict) -> int:
        return sum(compute_kinds(side).values())

    @property
    def both_npu(self) -> bool:
        return all(self.compiled) and self.cpu(self.mine) == 0 and self.cpu(self.theirs) == 0

    @property
    def cycles(self) -> float | None:
        return self.mine["cycles"] / self.theirs["cycles"] if all(self.compiled) and self.theirs["cycles"] else None

    @property
    def seconds(self) -> float | None:
        return self.mine["seconds"] / self.theirs["seconds"] if all(self.compiled) else None


def _pairs(rows: list[dict], target: str) -> list[Pair]:
    failed = {"error": None}
    out = []
    for row in rows:
        if "error" in row:  # the model itself does not build: the same failure on both sides
            out.append(Pair(row["spec"], row["family"], row["macs"], {"error": row["error"]}, {"error": row["error"]}))
            continue
        out.append(Pair(row["spec"], row["family"], row["macs"], row["tosakit"][target],
                        row.get("executorch", {}).get(target, failed)))
    return out


def _geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(map(math.log, values))) if values else float("nan")


def _violations(pairs: list[Pair], target: str) -> list[str]:
    """The issue's coverage rules broken on ``target``."""
    out = []
    for p in pairs:
        mine_ok, theirs_ok = p.compiled
        if theirs_ok and not mine_ok:
            out.append(f"{p.spec}: tosakit fails where ExecuTorch compiles ({p.mine['error'][:120]})")
        elif mine_ok and theirs_ok:
            mine, theirs = p.cpu(p.mine), p.cpu(p.theirs)
            if target.startswith("ethos-u85") and mine and not theirs:
                out.append(f"{p.spec}: {mine} CPU compute op(s) {_kinds(p.mine)} where ExecuTorch has none")
            elif mine > theirs:
                out.append(f"{p.spec}: {mine} CPU compute ops {_kinds(p.mine)}, ExecuTorch {theirs} {_kinds(p.theirs)}")
    return out


def _kinds(side: dict) -> str:
    return "{" + ", ".join(f"{k} {v}" for k, v in sorted(compute_kinds(side).items())) + "}"


def _summary(pairs: list[Pair], target: str) -> dict:
    npu = [p for p in pairs if p.both_npu]
    both = [p for p in pairs if all(p.compiled)]
    ratios = {p.spec: p.cycles for p in npu}
    times = [p.seconds for p in both]
    counts = [0] * (len(BUCKETS) + 1)
    for r in ratios.values():
        counts[sum(r > b for b in BUCKETS)] += 1
    worst = sorted(ratios.items(), key=lambda kv: -kv[1])[:5]
    slowest = sorted(((p.spec, p.seconds) for p in both), key=lambda kv: -kv[1])[:3]
    return {"target": target, "networks": len(pairs), "both_compile": len(both), "both_wholly_npu": len(npu),
            "cycles_geomean_npu": _geomean(list(ratios.values())),
            "cycles_geomean_all": _geomean([p.cycles for p in both if p.cycles]), "goal": GOALS[target],
            "worst": worst, "above_1": [s for s, r in ratios.items() if r > 1.0], "distribution": counts,
            "compile_geomean": _geomean(times), "compile_worst": slowest,
            "compile_above_1": [p.spec for p in both if p.seconds > 1.0],
            "tosakit_failures": [p.spec for p in pairs if not p.compiled[0]],
            "executorch_failures": [p.spec for p in pairs if not p.compiled[1]],
            "violations": _violations(pairs, target)}


def _cell(p: Pair) -> list[str]:
    mine_ok, theirs_ok = p.compiled
    ratio = f"{p.cycles:.3f}" if p.cycles else ("tosakit failed" if not mine_ok else "ET failed")
    cpu = f"{p.cpu(p.mine) if mine_ok else '-'} / {p.cpu(p.theirs) if theirs_ok else '-'}"
    seconds = f"{p.mine.get('seconds', 0):.1f} / {p.theirs.get('seconds', 0):.1f}" if all(p.compiled) else "-"
    return [ratio, cpu, seconds]


def _commit(root: Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _markdown(by_target: dict[str, list[Pair]], summaries: list[dict], stamp: str) -> str:
    targets = list(by_target)
    lines = [f"Field sweep, {stamp}: tosakit / ExecuTorch 1.5.1, the same exported graph, Vela 5.2.0, int8. "
             "Cycles: Vela's estimate; CPU ops: compute ops left on the CPU (tosakit / ExecuTorch); "
             "compile: seconds (tosakit / ExecuTorch).", ""]
    for s in summaries:
        lines.append(f"- **{s['target']}**: cycles geometric mean **{s['cycles_geomean_npu']:.3f}x** over the "
                     f"{s['both_wholly_npu']} networks both place wholly on the NPU (goal {s['goal']:.2f}x), "
                     f"{s['cycles_geomean_all']:.3f}x over all {s['both_compile']} both compile; worst "
                     + ", ".join(f"{k} {v:.3f}x" for k, v in s["worst"][:3])
                     + f"; compile time {s['compile_geomean']:.3f}x; coverage rules broken: {len(s['violations'])}")
    head = ["network", "family", "GMAC"] + [f"{t[6:]} {c}" for t in targets for c in ("cycles", "CPU ops", "compile s")]
    lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, p in enumerate(by_target[targets[0]]):
        cells = [p.spec, p.family, f"{p.macs / 1e9:.2f}"] + [c for t in targets for c in _cell(by_target[t][i])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _plot(by_target: dict[str, list[Pair]], path: Path, stamp: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    targets = list(by_target)
    order = sorted(range(len(by_target[targets[0]])), key=lambda i: (by_target[targets[0]][i].family,
                                                                      by_target[targets[0]][i].spec))
    families = sorted({p.family for p in by_target[targets[0]]})
    palette = [plt.get_cmap(m)(k) for m in ("tab20", "tab20b", "tab20c") for k in range(20)]  # 60 distinct
    colours = {f: palette[i % len(palette)] for i, f in enumerate(families)}
    fig, axes = plt.subplots(len(targets), 1, figsize=(max(12, 0.16 * len(order)), 4.2 * len(targets)), sharex=True)
    for ax, target in zip(axes, targets):
        pairs = [by_target[target][i] for i in order]
        for x, p in enumerate(pairs):
            if p.cycles:
                ax.bar(x, p.cycles, color=colours[p.family], edgecolor="black" if not p.both_npu else None,
                       hatch="//" if not p.both_npu else None)
            else:
                ax.plot(x, 0.05, "x", color="red")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(GOALS[target], color="grey", linestyle="--", linewidth=0.8)
        ax.set_ylabel(f"{target}\ncycles, tosakit / ExecuTorch")
    axes[-1].set_xticks(range(len(order)), [re.sub(r"^[a-z]+:", "", by_target[targets[0]][i].spec)
                                            for i in order], rotation=90, fontsize=6)
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[f]) for f in families]
    axes[0].legend(handles, families, fontsize=7, ncol=1 + len(families) // 24, loc="upper left",
                   bbox_to_anchor=(1.005, 1.0))  # beside the bars, never over them
    axes[0].set_title(f"Field sweep ({stamp}): lower is better; dashed: the goal; hatched: CPU ops on a side; "
                      "x: a side failed", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def report(out: Path, specs: list[str], targets) -> None:
    """Print the sweep's tables and summary for ``specs`` (the rows there are), and write its files."""
    import datetime

    paths = [out / "rows" / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', s)}.json" for s in specs]
    rows = [json.loads(p.read_text()) for p in paths if p.exists()]
    if not rows:
        print("no rows yet")
        return
    by_target = {t: _pairs(rows, t) for t, _ in targets}
    summaries = []
    for target, pairs in by_target.items():
        print(f"\n{target}: {'network':<44}{'cycles':>9}{'CPU ops':>11}{'compile s':>16}  family")
        for p in pairs:
            ratio, cpu, seconds = _cell(p)
            print(f"  {p.spec:<52}{ratio:>9}{cpu:>11}{seconds:>16}  {p.family}")
        s = _summary(pairs, target)
        summaries.append(s)
        print(f"{target}: cycles geometric mean {s['cycles_geomean_npu']:.3f}x over {s['both_wholly_npu']} networks "
              f"both place wholly on the NPU (goal <= {s['goal']:.2f}), {s['cycles_geomean_all']:.3f}x over all "
              f"{s['both_compile']} both compile; worst " + ", ".join(f"{k} {v:.3f}x" for k, v in s["worst"]))
        print("  distribution: " + ", ".join(f"{label} {n}" for label, n in zip(
            [f"<={BUCKETS[0]}"] + [f"{a}-{b}" for a, b in zip(BUCKETS, BUCKETS[1:])] + [f">{BUCKETS[-1]}"],
            s["distribution"])) + f"; above 1.0x: {', '.join(s['above_1']) or 'none'}")
        print(f"  compile time geometric mean {s['compile_geomean']:.3f}x (goal <= 0.2); slowest "
              + ", ".join(f"{k} {v:.2f}x" for k, v in s["compile_worst"])
              + f"; above ExecuTorch's: {', '.join(s['compile_above_1']) or 'none'}")
        print(f"  tosakit fails: {', '.join(s['tosakit_failures']) or 'none'}; ExecuTorch fails: "
              f"{', '.join(s['executorch_failures']) or 'none'}")
        print(f"  coverage rules broken: {len(s['violations'])}" + "".join(f"\n    {v}" for v in s["violations"]))
    stamp = f"{datetime.date.today()}, commit {_commit(out.parent.parent.parent)}, {len(rows)} networks"
    (out / "sweep.md").write_text(_markdown(by_target, summaries, stamp))
    (out / "summary.json").write_text(json.dumps(summaries, indent=1))
    _plot(by_target, out / "sweep.png", stamp)
    print(f"\nwritten: {out / 'sweep.md'}, {out / 'summary.json'}, {out / 'sweep.png'}")
