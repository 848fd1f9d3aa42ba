"""The reports of a compile: report.json, report.html, layers.csv and the summary printed on the terminal —
where every op runs, each delegate's figures, and how far results drift from float."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
from pathlib import Path

from .errors import write_atomic
from .program import deserialize_pte
from .runtime.cpu_cycles import DEFAULT_CORE, CpuCycles, cpu_cycles


def write_reports(folder: Path, model_name: str, target: str, output: Path, edge, program, verification=None,
                  core: str = DEFAULT_CORE) -> None:
    """report.json, report.html and (with per-layer verification) layers.csv, in ``folder``; CPU kernels estimated
    for ``core``."""
    write_report(folder / "report.json", model_name, target, output, edge, program, verification, core)
    if verification is not None and verification.layers:
        write_layers_csv(folder / "layers.csv", verification.layers)
    write_html(folder / "report.html", f"{model_name} -> {target}", edge, program, verification, core)


def cpu_cycles_of(program, core: str = DEFAULT_CORE) -> list[CpuCycles]:
    """Each method's CPU kernel calls estimated for ``core``; methods that call no kernel left out."""
    plans = deserialize_pte(program.buffer)[0].execution_plan
    return [c for c in (cpu_cycles(p, core) for p in plans) if c.calls]


def write_report(path: Path, model_name: str, target: str, output: Path, edge, program, verification=None,
                 core: str = DEFAULT_CORE) -> None:
    """The delegation report as JSON: where every op runs, each delegate's figures, the CPU kernels' cycles."""
    report = {
        "model": model_name,
        "target": target,
        "output": str(output),
        "pte_bytes": len(program.buffer),
        "arena_bytes": program.emitted.arena_bytes,
        "constant_bytes": program.emitted.constant_bytes,
        "cpu_kernels": program.emitted.kernel_ops,
        "runner_memory": [m.as_dict() for m in runner_memories(program)],
        "cpu_cycles": [c.as_dict() for c in cpu_cycles_of(program, core)],
        "placements": [vars(p) for p in edge.placements],
        "delegates": [
            {**{k: v for k, v in vars(d).items() if k != "report"},
             "vela": _vela_dict(d.report)} for d in edge.delegates
        ],
    }
    if verification is not None:
        report["verification"] = {
            "outputs": [{"index": o.index, "shape": list(o.shape), "vs_float": _plain(o.vs_float),
                         "vs_fake_quant": _plain(o.vs_fake_quant)} for o in verification.outputs],
            "layers": [{**{k: v for k, v in vars(lay).items() if k != "vs_float"}, "vs_float": _plain(lay.vs_float),
                        "matches": lay.matches} for lay in verification.layers],
            "npu_vs_tosa": [{**vars(c), "bit_exact": c.bit_exact} for c in verification.engines],
            "npu_error": verification.npu_error,
            "npu_operations": [vars(r) for r in verification.npu_ops],
        }
    write_atomic(path, json.dumps(report, indent=2, default=str).encode())


def _plain(agreement) -> dict | None:
    if agreement is None:
        return None
    return {k: (str(v) if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))) else v)
            for k, v in vars(agreement).items()}


def _vela_dict(report) -> dict | None:
    if report is None:
        return None
    fields = ("sram_used_bytes", "offchip_used_bytes", "npu_cycles", "total_cycles", "mac_count", "npu_ops",
              "cpu_ops", "inference_time_s", "clock_hz", "system_config", "memory_mode", "macs_per_cycle",
              "mac_utilisation", "ideal_cycles", "bound_by")
    out = {f: getattr(report, f, None) for f in fields}
    out["per_op"] = [vars(o) for o in report.per_op]
    return out


def runner_memories(program) -> list:
    """Each method's RunnerMemory."""
    from .runtime.pools import runner_memory

    emitted = program.emitted
    return [runner_memory(emitted.program, emitted.segments, plan, program.data_map())
            for plan in emitted.program.execution_plan]


def summary(output: Path, edge, program, seconds: float, core: str = DEFAULT_CORE) -> str:
    """What runs where, Vela's figures and the CPU kernels' estimated cycles on ``core``, for the terminal."""
    lines = []
    compute = [p for p in edge.placements if p.compute]
    on_cpu = [p for p in edge.placements if p.placement == "cpu"]
    delegated = sum(1 for p in compute if p.placement == "delegate")
    lines.append(f"ops: {delegated} of {len(compute)} compute ops delegated; "
                 f"{len(on_cpu)} op(s) on the CPU")
    for d in edge.delegates:
        ops = ", ".join(f"{k} {v}" for k, v in sorted(d.tosa_ops.items(), key=lambda kv: -kv[1]))
        lines.append(f"delegate {d.name} -> {d.backend_id} ({d.target}): {d.node_count} graph nodes, "
                     f"payload {d.payload_bytes / 1024:.1f} KiB")
        lines.append(f"  TOSA: {ops}")
        if d.report is not None:
            r = d.report
            lines.append(f"  Vela: SRAM used {r.sram_used_bytes / 1024:.2f} KiB, off-chip used "
                         f"{r.offchip_used_bytes / 1024:.2f} KiB, {r.total_cycles:,} cycles estimated "
                         f"({r.inference_time_s * 1e3:.3f} ms at {r.clock_hz / 1e6:.0f} MHz), "
                         f"MAC utilisation {100 * r.mac_utilisation:.1f}%, "
                         f"{r.npu_ops} NPU op(s), {r.cpu_ops} CPU op(s)")
            if r.bound_by:
                lines.append("  cycles bound by: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in r.bound_by.items()))
            if r.memory_hint:
                lines.append(f"  hint: {r.memory_hint}")
            if r.memory_mode.startswith("Dedicated_Sram"):  # the SRAM Vela plans is region 2, the runner's to lend
                lines.append(f"  fast scratch: {r.sram_used_bytes} B of SRAM the runner lends this delegate "
                             "(ET_ARM_BAREMETAL_FAST_SCRATCH_TEMP_ALLOCATOR_POOL_SIZE)")
    for p in on_cpu:
        if p.kernel and not p.compute:  # a quantize or dequantize a kernel took in
            continue
        where = f" [{p.source}]" if p.source else ""
        kernel = f" -> {p.kernel}" if p.kernel else ""
        lines.append(f"cpu: {p.node} ({p.target}): {p.reason}{kernel}{where}")
    if program.emitted.kernel_ops:
        lines.append(f"CPU kernels: {', '.join(program.emitted.kernel_ops)}")
        lines += [c.summary() for c in cpu_cycles_of(program, core)]
    for kind, qs in (edge.io_quantization or {}).items():
        for i, q in enumerate(qs):
            if q is not None:
                lines.append(f"{kind[:-1]} {i}: {str(q.dtype).replace('torch.', '')}, scale {q.s:.9g}, zero point {q.zp}"
                             " (real = (q - zero point) x scale)")
    lines += [m.summary() for m in runner_memories(program)]
    lines.append(f"wrote {output} ({len(program.buffer) / 1024:.1f} KiB; arena {program.emitted.arena_bytes} B) "
                 f"in {seconds:.1f} s")
    return "\n".join(lines)


def _cpu_cycles_html(c: CpuCycles) -> str:
    rows = [[k.index, k.kernel, *(("no estimate", "", "") if k.estimate is None else
                                  (k.estimate.function, f"{k.estimate.macs:,}" if k.estimate.macs else "",
                                   f"{k.estimate.cycles:,}"))] for k in c.calls]
    return (f"<h2>CPU kernels of {html.escape(c.method)} on {html.escape(c.core)}</h2><p>Estimated for "
            f"{html.escape(c.board.name)}: {c.total:,} cycles, {c.milliseconds(c.total):.2f} ms.</p>"
            + _table(["instruction", "kernel", "runs as", "MACs", "cycles"], rows))


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def snr_plot(layers) -> str | None:
    """SNR against float per layer, with layers that differ from the fake-quantized model in red."""
    points = [(i, layer) for i, layer in enumerate(layers) if layer.vs_float is not None]
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, len(points) * 0.12), 3.2))
    xs = [i for i, _ in points]
    ys = [min(layer.vs_float.snr_db, 100.0) for _, layer in points]
    ax.plot(xs, ys, "-o", markersize=3, color="#2a6fdb", label="SNR against float (dB)")
    bad = [(i, y) for (i, layer), y in zip(points, ys) if not layer.matches]
    if bad:
        ax.scatter(*zip(*bad), color="#d62728", zorder=3, label="differs from the fake-quantized model")
    clipped = [(i, y) for (i, layer), y in zip(points, ys) if getattr(layer, "saturates", False)]
    if clipped:
        ax.scatter(*zip(*clipped), marker="v", s=40, color="#e07b00", zorder=4,
                   label="saturates: clips values at its integer limits")
    ax.set_xlabel("layer (graph order)")
    ax.set_ylabel("SNR (dB)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    png = _png(fig)
    plt.close(fig)
    return png


def _profile_html(profile, rows: int = 200) -> str:
    """The simulated run's timeline (estimated device time): totals, the NPU's counters, the longest events."""
    total = profile.total_us or 1.0
    events = sorted(profile.events, key=lambda e: -e.duration_us)[:rows]
    counters = profile.counters()
    return ("<h2>Where the time goes (estimated on the device)</h2><p>The program run on the host with each Ethos-U "
            "operation timed by the simulator's performance model and each CPU kernel by the Cortex-M cost rules "
            f"({html.escape(profile.core)}): {profile.total_us:,.1f} us in all, NPU {profile.unit_us('NPU'):,.1f} "
            f"us, CPU {profile.unit_us('CPU'):,.1f} us. Cycles are estimates; beats are the bytes the simulation "
            "moved. The whole timeline: <code>tosakit run FILE.pte --random --trace out.json</code>.</p>"
            + (_table(list(counters), [[f"{v:,}" for v in counters.values()]]) if counters else "")
            + _table(["unit", "instruction", "what", "start us", "time us", "share", "cycles", "bound by"],
                     [[e.unit, e.instruction, e.name, f"{e.start_us:,.1f}", f"{e.duration_us:,.1f}",
                       f"{100 * e.duration_us / total:.1f}%", "" if e.cycles is None else f"{e.cycles:,}",
                       e.args.get("bound_by", "")] for e in events]))


def cycles_plot(per_op) -> str | None:
    """Vela's estimated cycles per operator (bars, coloured by what bounds them) and MAC utilisation (line),
    in graph order."""
    ops = [o for o in per_op if o.cycles > 0]
    if not ops:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6.0, len(ops) * 0.12), 3.2))
    xs = range(len(ops))
    colours = dict(zip(dict.fromkeys(o.bound_by for o in ops), ("#2a6fdb", "#c0392b", "#27ae60", "#8e44ad")))
    for bound, colour in colours.items():
        picked = [(x, o.cycles) for x, o in zip(xs, ops) if o.bound_by == bound]
        ax.bar([x for x, _ in picked], [c for _, c in picked], color=colour, label=f"cycles, {bound}-bound")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_xlabel("operator (graph order)")
    ax.set_ylabel("cycles")
    util = ax.twinx()
    util.plot(xs, [100 * o.mac_utilisation for o in ops], color="#e07b00", marker=".", linewidth=1,
              label="MAC utilisation (%)")
    util.set_ylabel("MAC utilisation (%)")
    util.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    png = _png(fig)
    plt.close(fig)
    return png


STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:1em 0}"
         "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}th{background:#f3f3f3}"
         "tr.saturated td{background:#fdebd0}p.hint{background:#fdebd0;padding:6px 10px}")


def _write_page(path: Path, title: str, parts: list[str]) -> None:
    """One self-contained HTML page, written atomically."""
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>")
    write_atomic(path, page.encode())


def _table(headers, rows, marked=None) -> str:
    """``marked``: per row, a CSS class for it (or None)."""
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in headers)
    marked = marked or [None] * len(rows)
    body = "".join((f"<tr class='{m}'>" if m else "<tr>") + "".join(f"<td>{html.escape(str(c))}</td>" for c in row)
                   + "</tr>" for row, m in zip(rows, marked))
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return "inf" if math.isinf(x) else f"{x:.4g}"
    return str(x)


def _share(x) -> str:
    """A share of values as a percentage ("-" when there is none)."""
    from .verify.report import share_text
    return "-" if x is None else ("0" if x == 0 else share_text(x))


def _limits(limits) -> str:
    from .verify.report import limits_name
    return "" if limits is None else limits_name(limits)


def write_layers_csv(path: Path, layers) -> None:
    """The per-layer table as CSV. ``saturated``: the share of an integer layer's values clipped at its
    integer limits (``qmin``, ``qmax``); ``saturation_source``: the nearest layer or input on its way (itself
    included) that clips notably."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["delegate", "node", "op", "shape", "integer", "steps_off_fake_quant", "rel_error", "snr_db_vs_float",
                "cosine_vs_float", "matches", "saturated", "qmin", "qmax", "saturation_source"])
    for layer in layers:
        f = layer.vs_float
        limits = getattr(layer, "limits", None)
        w.writerow([layer.delegate, layer.node, layer.target, "x".join(map(str, layer.shape)), layer.integer,
                    _fmt(layer.steps_off), _fmt(layer.rel_error), _fmt(f.snr_db if f else None),
                    _fmt(f.cosine if f else None), layer.matches, _fmt(getattr(layer, "saturated", None)),
                    limits[0] if limits else "-", limits[1] if limits else "-",
                    getattr(layer, "saturation_source", None) or "-"])
    write_atomic(path, buf.getvalue().encode())


def write_html(path: Path, title: str, edge, program=None, verification=None, core: str = DEFAULT_CORE) -> None:
    """One self-contained HTML page (plots embedded)."""
    parts = [f"<h1>{html.escape(title)}</h1>"]
    placements = edge.placements
    delegated = sum(p.placement == "delegate" for p in placements)
    parts.append(f"<p>{delegated} of {len(placements)} ops delegated; "
                 f"{len(placements) - delegated} on the CPU.</p>")
    if program is not None:
        e = program.emitted
        parts.append(f"<p>.pte: {len(program.buffer):,} bytes; arena {e.arena_bytes:,} B; constants "
                     f"{e.constant_bytes:,} B; CPU kernels: {html.escape(', '.join(e.kernel_ops) or 'none')}</p>")
    for d in edge.delegates:
        parts.append(f"<h2>{html.escape(d.name)}: {html.escape(d.backend_id)} ({html.escape(d.target)})</h2>")
        parts.append(_table(["TOSA op", "count"], sorted(d.tosa_ops.items(), key=lambda kv: -kv[1])))
        if d.report is not None:
            r = d.report
            parts.append(_table(["SRAM used", "off-chip used", "cycles", "inference time", "MACs", "MAC utilisation",
                                 "NPU ops", "CPU ops"],
                                [[f"{r.sram_used_bytes / 1024:.2f} KiB", f"{r.offchip_used_bytes / 1024:.2f} KiB",
                                  f"{r.total_cycles:,}", f"{r.inference_time_s * 1e3:.3f} ms", f"{r.mac_count:,}",
                                  f"{100 * r.mac_utilisation:.1f}%", r.npu_ops, r.cpu_ops]]))
            png = cycles_plot(r.per_op)
            if png:
                parts.append(f'<img alt="cycles per operator" src="data:image/png;base64,{png}">')
            parts.append("<details><summary>Per operator</summary>" + _table(
                ["name", "operator", "TOSA op", "cycles", "bound by", "MACs", "MAC utilisation"],
                [[o.name, o.operator, o.tosa_op or "", f"{o.cycles:,}", o.bound_by, f"{o.macs:,}",
                  f"{100 * o.mac_utilisation:.1f}%"] for o in r.per_op]) + "</details>")
    if program is not None:
        parts += [_cpu_cycles_html(c) for c in cpu_cycles_of(program, core)]
    parts.append("<h2>Where each op runs</h2>")
    parts.append(_table(["node", "op", "runs on", "why not delegated", "CPU kernel", "source"],
                        [[p.node, p.target, p.tag or "CPU", p.reason or "", p.kernel or "", p.source or ""]
                         for p in placements]))
    if verification is not None:
        parts.append("<h2>Outputs against PyTorch</h2>")
        rows = []
        for o in verification.outputs:
            for name, a in (("float", o.vs_float), ("fake-quantized", o.vs_fake_quant)):
                if a is not None:
                    rows.append([o.index, "x".join(map(str, o.shape)), name, _fmt(a.max_abs_error), _fmt(a.snr_db),
                                 f"{a.cosine:.5f}", "-" if a.top1 is None else a.top1])
        parts.append(_table(["output", "shape", "reference", "max |error|", "SNR dB", "cosine", "top-1 agrees"], rows))
        hint = verification.saturation_hint() if hasattr(verification, "saturation_hint") else None
        if hint:
            parts.append(f"<p class='hint'><b>Saturation.</b> {html.escape(hint)}</p>")
        inputs = getattr(verification, "quantized_inputs", [])
        if inputs:
            parts.append("<h2>Delegate inputs quantized on the CPU</h2>" + _table(
                ["delegate", "input", "shape", "clipped at the integer limits"],
                [[i.delegate, i.node, "x".join(map(str, i.shape)), f"{_share(i.saturated)} ({_limits(i.limits)})"]
                 for i in inputs], ["saturated" if i.saturates else None for i in inputs]))
        if getattr(verification, "profile", None) is not None:
            parts.append(_profile_html(verification.profile))
        npu_ops = getattr(verification, "npu_ops", [])
        if npu_ops:
            compared = [r for r in npu_ops if r.values]
            parts.append("<h2>Per NPU operation</h2><p>Each operation of the simulated Ethos-U command stream "
                         "against the box of the TOSA tensor Vela says it writes (its debug database and high-level "
                         f"command stream): {len(compared)} of {len(npu_ops)} compared, "
                         f"{sum(1 for r in compared if r.differ)} differ.</p>" + _table(
                             ["delegate", "offset", "Vela op", "TOSA op", "tensor", "values", "differ", "max |diff|",
                              "note"],
                             [[r.delegate, f"{r.offset:#x}", r.vela_op, r.tosa_op, r.tensor, r.values or "",
                               r.differ if r.values else "", r.max_diff if r.values else "", r.note] for r in npu_ops],
                             ["saturated" if r.differ else None for r in npu_ops]))
        if verification.layers:
            first = verification.first_divergent_layer
            parts.append("<h2>Per layer</h2><p>" + (
                f"First layer that differs from the fake-quantized model: <b>{html.escape(first.node)}</b> "
                f"({html.escape(first.target)})." if first else
                "Every layer matches the fake-quantized model; what remains is quantization error.") + "</p>")
            parts.append("<p>SNR against float is that of the same value in the float model (the graph the quantizer "
                         "saw, without its quantization). <i>Saturated</i>: the share of an integer layer's values its "
                         "calibrated range clips at the integer limits; highlighted rows clip more than 1%, and a "
                         "layer's note names the saturation on its way, which its SNR against float includes.</p>")
            png = snr_plot(verification.layers)
            if png:
                parts.append(f'<img alt="SNR per layer" src="data:image/png;base64,{png}">')
            note = getattr(verification, "saturation_note", lambda lay: "")
            parts.append(_table(
                ["delegate", "node", "op", "shape", "steps off (fake-quant)", "rel. error", "SNR dB vs float",
                 "matches", "saturated", "note"],
                [[lay.delegate, lay.node, lay.target, "x".join(map(str, lay.shape)), _fmt(lay.steps_off),
                  _fmt(lay.rel_error), _fmt(lay.vs_float.snr_db if lay.vs_float else None), lay.matches,
                  _share(getattr(lay, "saturated", None)), note(lay)]
                 for lay in verification.layers],
                ["saturated" if getattr(lay, "saturates", False) else None for lay in verification.layers]))
    _write_page(path, title, parts)


def write_accuracy_html(path: Path, title: str, rows) -> None:
    """Accuracy per scheme, and SNR against float per layer for each scheme (one line each)."""
    parts = [f"<h1>{html.escape(title)}</h1>", _table(
        ["scheme", "float %", "fake-quantized %", "program %", "points lost", "output SNR dB", "CPU ops"],
        [[r.scheme, f"{r.float_accuracy:.2f}", f"{r.fake_quant_accuracy:.2f}", f"{r.program_accuracy:.2f}",
          f"{r.loss:.2f}", _fmt(r.output_snr_db), r.cpu_ops] for r in rows])]
    with_layers = [r for r in rows if r.layers is not None and r.layers.layers]
    if with_layers:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7.0, 3.2))
        for r in with_layers:
            ys = [min(lay.vs_float.snr_db, 100.0) for lay in r.layers.layers if lay.vs_float is not None]
            ax.plot(range(len(ys)), ys, marker=".", label=r.scheme)
        ax.set_xlabel("layer (graph order)")
        ax.set_ylabel("SNR against float (dB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        parts.append("<h2>Where accuracy is lost</h2>"
                     f'<img alt="SNR per layer per scheme" src="data:image/png;base64,{_png(fig)}">')
        plt.close(fig)
    _write_page(path, title, parts)


def write_sweep_html(path: Path, title: str, rows, fronts: dict[str, set[str]]) -> None:
    """The sweep: each scheme's figures, accuracy against cycles and against encoded weight bytes (the Pareto
    front joined and named; ``fronts``: cost field -> schemes on its front), and each NPU operation's cycles
    under every scheme, the memory bounding it named where it is not the NPU."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    accuracy = rows[0].accuracy is not None
    score = "program top-1 %" if accuracy else "program SNR against float (dB)"
    parts = [f"<h1>{html.escape(title)}</h1>", _table(
        ["scheme", *(["float %", "fake-quantized %", "program %"] if accuracy else []), "output SNR dB", "cycles",
         "encoded weights B", "off-chip B", "MAC utilisation %", "CPU ops"],
        [[r.scheme, *([f"{r.accuracy.float_accuracy:.2f}", f"{r.accuracy.fake_quant_accuracy:.2f}",
                       f"{r.accuracy.program_accuracy:.2f}"] if accuracy else []), _fmt(r.output_snr_db),
          f"{r.cycles:,}", f"{r.weights_encoded_bytes:,}", f"{r.offchip_bytes:,}", f"{100 * r.mac_utilisation:.1f}",
          r.cpu_ops] for r in rows])]
    fig, axes = plt.subplots(1, 2, figsize=(10.0, 3.6))
    for ax, (cost, label) in zip(axes, (("cycles", "cycles (Vela)"), ("weights_encoded_bytes", "encoded weights (B)"))):
        front = sorted((r for r in rows if r.scheme in fronts[cost]), key=lambda r: getattr(r, cost))
        ax.plot([getattr(r, cost) for r in front], [r.score for r in front], color="tab:orange", zorder=1)
        for r in rows:
            ax.scatter(getattr(r, cost), r.score, color="tab:orange" if r.scheme in fronts[cost] else "tab:blue",
                       zorder=2)
            ax.annotate(r.scheme, (getattr(r, cost), r.score), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(label)
        ax.set_ylabel(score)
        ax.grid(alpha=0.3)
    parts.append("<h2>Accuracy against cost (the Pareto front in orange)</h2>"
                 f'<img alt="accuracy against cycles and flash" src="data:image/png;base64,{_png(fig)}">')
    plt.close(fig)
    names = list(dict.fromkeys(op.name for r in rows for op in r.per_op))
    cells = [{op.name: op for op in r.per_op} for r in rows]
    body = []
    for name in names:
        ops = [c.get(name) for c in cells]
        first = next(op for op in ops if op is not None)
        body.append([name, first.operator, *("-" if op is None else f"{op.cycles:,}" + (
            f" ({op.bound_by})" if op.bound_by != "NPU" else "") for op in ops)])
    parts.append("<h2>Per NPU operation: cycles under each scheme (the memory bounding it, where not the NPU)</h2>"
                 + _table(["operation", "operator", *(r.scheme for r in rows)], body))
    _write_page(path, title, parts)
