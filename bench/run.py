"""tosakit benchmarks: figures printed side by side in one run (make bench)."""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from host_runtime import host_runtime
from side_env import side_env

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "out"
ZOO = ("mv2", "mv3", "resnet18", "transformer", "lstm", "unet", "audio1d", "digits", "waves")
# ExecuTorch's Ethos-U model tests, from the field's own definitions where they install (`--models field`)
FIELD = ("ds_cnn", "resnet8", "mobilenet_v1_025", "deep_autoencoder", "wav2letter", "conformer", "crnn",
         "torchvision:mobilenet_v2", "torchvision:mobilenet_v3_small", "torchvision:mobilenet_v3_large",
         "torchvision:resnet18", "torchvision:inception_v3", "torchvision:deeplabv3_mobilenet_v3_large",
         "timm:deit_tiny_patch16_224")
MODEL_SETS = {"zoo": ZOO, "field": FIELD}
TARGETS = (("ethos-u55-128", "Shared_Sram"), ("ethos-u85-256", None))


def accuracy(args) -> None:
    """Trained digits CNN and waves net on ethos-u55-128: float vs fake-quant vs lowered-program accuracy."""
    from tosakit.accuracy import measure, table
    from tosakit.zoo.trained import digits, digits_data, waves, waves_data

    for name, (model, data) in {"digits": (digits()[0], digits_data()), "waves": (waves()[0], waves_data())}.items():
        print(f"-- {name} (held-out {len(data.test_y)} samples)")
        print(table(measure(model, data, "ethos-u55-128", ["int8", "int8-per-tensor", "a16w8"])), flush=True)


def mv2_snr(args) -> None:
    """Seeded-random MobileNetV2, fixed calibration set: output SNR against float per weight scheme."""
    import torch

    from tosakit.accuracy import output_snr
    from tosakit.zoo.mobilenet_v2 import build

    model, _ = build()
    g = torch.Generator().manual_seed(1)
    calibration = [(torch.randn(1, 3, 224, 224, generator=g),) for _ in range(8)]
    evaluation = [(torch.randn(1, 3, 224, 224, generator=g),) for _ in range(4)]
    snr = output_snr(model, calibration, evaluation, "ethos-u55-128", ["int8", "int8-per-tensor", "a16w8"])
    print(f"{'scheme':<18}{'output SNR dB':>14}")
    for scheme, db in snr.items():
        print(f"{scheme:<18}{db:>14.2f}")
    print(f"per-channel - per-tensor: {snr['int8'] - snr['int8-per-tensor']:+.2f} dB (goal: >= +3 dB)")


@dataclass
class Figures:
    """One compiled model's Ethos-U figures, summed over its delegates (SRAM: the peak)."""

    seconds: float
    cycles: int
    macs: int
    macs_per_cycle: int
    sram: int
    offchip: int
    cpu_ops: int

    @property
    def utilisation(self) -> float:
        return self.macs / (self.cycles * self.macs_per_cycle) if self.cycles else 0.0

    @staticmethod
    def of(reports, seconds: float, cpu_ops: int) -> "Figures":
        return Figures(seconds, sum(r.total_cycles for r in reports), sum(r.mac_count for r in reports),
                       max((r.macs_per_cycle for r in reports), default=1), max((r.sram_used_bytes for r in reports),
                                                                                 default=0),
                       sum(r.offchip_used_bytes for r in reports), cpu_ops)


# pure data movement, left out of both compilers' CPU op counts
_VIEWS = ("squeeze", "unsqueeze", "view", "permute", "clone", "expand", "alloc")


def _tosakit(name: str, module, inputs, target: str, memory_mode: str | None, firmware_io: bool = False) -> Figures:
    """Quantize, lower, run Vela and write the .pte with tosakit, timed as a whole; ``firmware_io``: NHWC
    int8 inputs and outputs, as firmware feeds a camera frame."""
    import torch

    from tosakit.flow import compile
    from tosakit.specs import EthosUCompileSpec

    spec = EthosUCompileSpec(target, memory_mode=memory_mode)
    if firmware_io:
        spec.with_int8_io()
        inputs = tuple(t.to(memory_format=torch.channels_last) if t.dim() == 4 else t for t in inputs)
    start = time.perf_counter()
    compiled = compile(module, inputs, spec, quantize=True)
    with open(OUT / "tosakit" / f"{name}_{target}{'_nhwc_int8' if firmware_io else ''}.pte", "wb") as f:
        compiled.program.write_to_file(f)
    seconds = time.perf_counter() - start
    cpu = [p for p in compiled.edge.placements if p.placement == "cpu" and p.compute
           and not any(v in p.target for v in _VIEWS)]  # compute ops, counted as ExecuTorch's are
    return Figures.of([d.report for d in compiled.edge.delegates], seconds, len(cpu))


def _executorch(jobs: list[dict]) -> dict[tuple[str, str], dict]:
    """Compile the jobs with ExecuTorch in the side environment; its results by (model, target)."""
    python = side_env()
    (OUT / "jobs.json").write_text(json.dumps(jobs, indent=1))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    subprocess.run([str(python), str(ROOT / "bench" / "executorch_side.py"), str(OUT / "jobs.json"),
                    str(OUT / "executorch.json")], check=True, env=env, stdout=subprocess.DEVNULL)
    return {(r["name"], r["target"]): r for r in json.loads((OUT / "executorch.json").read_text())}


def _executorch_figures(result: dict, memory_mode: str | None) -> Figures | None:
    """ExecuTorch's delegates measured by the same Vela run tosakit uses (its TOSA, its Vela flags); its CPU
    ops counted without pure data movement (views, squeezes)."""
    from tosakit.backends.ethosu.vela import compile_tosa
    from tosakit.specs import EthosUCompileSpec

    if "error" in result:
        return None
    spec = EthosUCompileSpec(result["target"], memory_mode=memory_mode)
    reports = [compile_tosa(Path(t).read_bytes(), spec).report for t in result["tosa"]]
    compute = [op for op in result["cpu_ops"] if not any(v in op.split(">")[0] for v in _VIEWS)]
    return Figures.of(reports, result["seconds"], len(compute))


_COLUMNS = (("compile s", lambda f: f.seconds, "{:.1f}"), ("cycles", lambda f: f.cycles, "{:,}"),
            ("util %", lambda f: 100 * f.utilisation, "{:.1f}"), ("SRAM KiB", lambda f: f.sram / 1024, "{:.0f}"),
            ("off-chip KiB", lambda f: f.offchip / 1024, "{:.0f}"), ("CPU ops", lambda f: f.cpu_ops, "{}"))


def _row(label: str, cells: list[str]) -> str:
    return f"{label:<30}" + "".join(f"{c:>14}" for c in cells)


def _ratio(a: float, b: float) -> float:
    return a / b if b else (1.0 if a == b else math.inf)


def _plot_ratios(ratios: dict[str, dict[str, float]]) -> Path:
    """Bars of tosakit / ExecuTorch per model and figure, 1.0 marked; written to bench/out/."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(ratios)
    figures = ("cycles", "SRAM KiB", "off-chip KiB", "compile s")
    fig, ax = plt.subplots(figsize=(max(8, 0.7 * len(labels) * len(figures) / 2), 4.5))
    width = 0.8 / len(figures)
    for i, figure in enumerate(figures):
        ax.bar([x + i * width for x in range(len(labels))], [ratios[m].get(figure, 0) for m in labels], width,
               label=figure)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("tosakit / ExecuTorch 1.5.1 (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = OUT / "ratios.png"
    fig.savefig(path, dpi=110)
    return path


def zoo(args) -> None:
    """The zoo, quantized, for ethos-u55-128 (Shared_Sram) and ethos-u85-256: compile seconds, cycles, MAC
    utilisation, SRAM, off-chip; with --compare-executorch, ExecuTorch 1.5.1's figures and the ratios."""
    import torch

    from tosakit.zoo import load_model

    (OUT / "tosakit").mkdir(parents=True, exist_ok=True)
    specs = [m for part in (args.models or "zoo").split(",") for m in MODEL_SETS.get(part, (part,))]
    models, loaded = [], {}
    for spec in specs:  # one exported module per model: both compilers start from the same graph
        name, module, inputs = load_model(spec)
        models.append(name)
        path = OUT / "models" / f"{name}.pt2"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.export.save(torch.export.export(module.eval(), inputs), path)
        torch.save(inputs, path.with_suffix(".inputs.pt"))
        loaded[name] = (torch.export.load(path).module(), inputs)
    jobs = [{"name": n, "model": str(OUT / "models" / f"{n}.pt2"),
             "inputs": str(OUT / "models" / f"{n}.inputs.pt"), "target": t, "memory_mode": m,
             "out": str(OUT / "executorch" / f"{n}_{t}")} for n in models for t, m in TARGETS]
    reuse = args.reuse_executorch and (OUT / "executorch.json").exists()
    theirs = ({(r["name"], r["target"]): r for r in json.loads((OUT / "executorch.json").read_text())} if reuse
              else _executorch(jobs) if args.compare_executorch else {})
    comparable: dict[str, bool] = {}
    ratios: dict[str, dict[str, float]] = {}
    table: list[dict] = []  # every figure printed, for bench/out/zoo.json
    for target, memory_mode in TARGETS:
        print(f"\n{target} ({memory_mode or 'default memory mode'})")
        print(_row("model", [c[0] for c in _COLUMNS]))
        for name in models:
            mine = _tosakit(name, *loaded[name], target, memory_mode)
            print(_row(f"{name} tosakit", [fmt.format(get(mine)) for _, get, fmt in _COLUMNS]), flush=True)
            table.append({"model": name, "target": target, "tosakit": vars(mine)})
            (OUT / "zoo.json").write_text(json.dumps(table, indent=1))
            if not theirs:
                continue
            result = theirs[(name, f"{target}")]
            other = _executorch_figures(result, memory_mode)
            table[-1]["executorch"] = vars(other) if other else {"error": result["error"]}
            (OUT / "zoo.json").write_text(json.dumps(table, indent=1))
            if other is None:
                print(_row(f"{name} executorch", ["failed: " + result["error"][:60]]))
                continue
            print(_row(f"{name} executorch", [fmt.format(get(other)) for _, get, fmt in _COLUMNS]))
            ratio = {label: _ratio(get(mine), get(other)) for label, get, _ in _COLUMNS if label != "CPU ops"}
            key = f"{name} {target.replace('ethos-', '')}"
            ratios[key] = ratio
            comparable[key] = other.cpu_ops <= mine.cpu_ops  # else its cycles leave out work ours include
            print(_row(f"{name} ratio", [f"{ratio[c[0]]:.3f}" if c[0] in ratio else "" for c in _COLUMNS]))
            # the network's own MACs: Vela also counts the zero taps of a space-to-depth stem
            ideal = max(1, math.ceil(min(mine.macs, other.macs) / mine.macs_per_cycle))
            print(_row("", [f"ideal {ideal:,} cycles:", f"tosakit {mine.cycles / ideal:.2f}x,",
                            f"executorch {other.cycles / ideal:.2f}x"]))
        if "mv2" in loaded:
            mine = _tosakit("mv2", *loaded["mv2"], target, memory_mode, firmware_io=True)
            print(_row("mv2 tosakit NHWC int8 I/O", [fmt.format(get(mine)) for _, get, fmt in _COLUMNS]), flush=True)
    if ratios:
        print("\ncycles ratio (tosakit / ExecuTorch), geometric mean and worst:")
        for target, _ in TARGETS:
            short = target.replace("ethos-", "")
            keys = [k for k in ratios if k.endswith(short)]
            fair = [k for k in keys if comparable[k]]
            for label, chosen in (("same work on the NPU", fair), ("all models", keys)):
                cycles = [ratios[k]["cycles"] for k in chosen]
                if cycles:
                    print(f"  {target} {label:<22} {math.exp(statistics.fmean(map(math.log, cycles))):.3f}  "
                          f"worst {max(cycles):.3f}  ({len(cycles)} models)")
            skipped = sorted(set(keys) - set(fair))
            if skipped:
                print(f"  not comparable (ExecuTorch ran compute ops on the CPU that tosakit runs on the NPU): "
                      f"{', '.join(skipped)}")
        print(f"ratio plot: {_plot_ratios(ratios)}")


def llm(args) -> None:
    """SmolLM2-135M's shape on ethos-u85-256, int8 and a8w4: decode cycles beside the DRAM's bound (``llm.py``)."""
    from llm import llm as run

    run(OUT)


def llm_quality(args) -> None:
    """A small decoder trained on the standard library's source: held-out perplexity per weight scheme."""
    from llm import llm_quality as run

    run(OUT)


WEIGHT_SCHEMES = ("int8", "a8w4", "a8w4@pointwise", "int8+2:4", "int8+cluster16", "int8+cluster8", "a8w4+2:4")


def weights(args) -> None:
    """Weights that fit the NPU: the built-in mv2 per weight scheme (tosakit sweep's figures) on ethos-u55-128
    (Shared_Sram) and ethos-u85-256, beside ExecuTorch 1.5.1's int8 and a8w4 (its TOSA through the same Vela) in
    the same run: cycles, encoded weights, off-chip bytes, the ratios, and how many NPU operations run Vela's 2:4
    sparse weight format; then the sweep's accuracy on the trained digits model (ethos-u55-128)."""
    import torch

    from tosakit.sweep import run_scheme, sweep, table
    from tosakit.zoo import load_model

    name, module, inputs = load_model("mv2")
    path = OUT / "models" / "mv2.pt2"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(torch.export.export(module.eval(), inputs), path)
    torch.save(inputs, path.with_suffix(".inputs.pt"))
    jobs = [{"name": f"mv2_{c}", "model": str(path), "inputs": str(path.with_suffix(".inputs.pt")), "target": t,
             "memory_mode": m, "out": str(OUT / "executorch" / f"mv2_{c}_{t}"), "config": c}
            for t, m in TARGETS for c in ("int8", "a8w4")]
    theirs = _executorch(jobs)
    ratios = {}  # scheme -> its ethos-u55-128 cycles / ExecuTorch's int8
    for target, memory_mode in TARGETS:
        et = {c: _executorch_figures(theirs[(f"mv2_{c}", target)], memory_mode) for c in ("int8", "a8w4")}
        print(f"\nmv2, {target} ({memory_mode or 'default memory mode'}); ExecuTorch 1.5.1 int8 {et['int8'].cycles:,} "
              f"cycles, a8w4 {et['a8w4'].cycles:,} cycles (off-chip {et['int8'].offchip / 2**20:.2f} / "
              f"{et['a8w4'].offchip / 2**20:.2f} MiB)")
        print(f"{'scheme':<18}{'cycles':>13}{'/ ET int8':>11}{'/ ET a8w4':>11}{'weights MiB':>13}{'off-chip MiB':>14}"
              f"{'2:4 ops':>9}")
        for scheme in WEIGHT_SCHEMES:
            row = run_scheme("mv2", target, scheme)
            if target == "ethos-u55-128":
                ratios[scheme] = row.cycles / et["int8"].cycles
            print(f"{scheme:<18}{row.cycles:>13,}{row.cycles / et['int8'].cycles:>11.3f}"
                  f"{row.cycles / et['a8w4'].cycles:>11.3f}{row.weights_encoded_bytes / 2**20:>13.2f}"
                  f"{row.offchip_bytes / 2**20:>14.2f}{row.sparse_ops:>9}", flush=True)
    losses = _trained_mv2_accuracy()
    ratios["a8w4 QAT"] = ratios["a8w4"]  # the same INT4 weights on the NPU, trained instead of calibrated
    fit = [s for s in losses if losses[s] <= 1.0 and ratios[s] <= 0.80]
    print("\nschemes within 1.0 point of float on the trained MobileNetV2 at or below 0.80x ExecuTorch's int8 cycles "
          "on ethos-u55-128: " + (", ".join(f"{s} ({losses[s]:.2f} points, {ratios[s]:.3f}x)" for s in fit) or "none"))
    print("\ndigits on ethos-u55-128 (450 held-out samples, 64 calibration samples, post-training):")
    print(table(sweep("digits", "ethos-u55-128", ("int8", "a16w8", "a8w4", "int8+cluster16", "int8+cluster8",
                                                    "int8+2:4"), progress=False)))


def _digits_rgb(size: int = 32):
    """scikit-learn's digits upscaled to ``size`` x ``size`` RGB (bilinear, the gray level in all three)."""
    import torch.nn.functional as F

    from tosakit.zoo.trained import Split, digits_data

    d = digits_data()
    up = lambda x: F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1)  # noqa: E731
    return Split(up(d.train_x), d.train_y, up(d.test_x), d.test_y)


def _train(model, data, epochs: int, lr: float, seed: int = 0, modes: bool = True) -> None:
    """AdamW with a cosine schedule, batches of 32 (the remainder dropped: batch norm needs a batch); ``modes``:
    switch the model to training and back (an exported graph switches with torchao's functions instead)."""
    import torch
    import torch.nn.functional as F

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=1e-4)
    steps = len(data.train_x) // 32
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs * steps)
    generator = torch.Generator().manual_seed(seed)
    if modes:
        model.train()
    for _ in range(epochs):
        order = torch.randperm(len(data.train_x), generator=generator)
        for i in range(steps):
            batch = order[32 * i: 32 * i + 32]
            optimizer.zero_grad()
            F.cross_entropy(model(data.train_x[batch]), data.train_y[batch]).backward()
            optimizer.step()
            schedule.step()
    if modes:
        model.eval()


def _trained_mv2_accuracy() -> dict[str, float]:
    """The MobileNetV2 family trained here: the built-in definition (width 1.0) with 10 classes, 15 epochs on
    digits upscaled to 32x32 RGB (cached in bench/out; gradient descent, so its figures vary from machine to
    machine); each scheme's accuracy on ethos-u55-128, the weight transforms fine-tuned 2 epochs through their
    hook (the zeros and shared levels kept); returns each scheme's points lost."""
    import torch

    from tosakit.accuracy import measure_scheme
    from tosakit.sweep import parse_scheme, prepare
    from tosakit.zoo.mobilenet_v2 import MobileNetV2

    data = _digits_rgb()
    torch.manual_seed(0)
    model, cached = MobileNetV2(num_classes=10), OUT / "mv2_digits.pt"
    start = time.perf_counter()
    if cached.exists():
        model.load_state_dict(torch.load(cached))
    else:
        _train(model, data, epochs=15, lr=1e-3)
        torch.save(model.state_dict(), cached)
    model.eval()
    print(f"\nMobileNetV2 (built-in definition, 10 classes) trained on digits at 32x32 RGB ({time.perf_counter() - start:.0f} s;"
          f" {len(data.test_x)} held-out samples), ethos-u55-128 Shared_Sram, 64 calibration samples:")
    print(f"{'scheme':<18}{'float %':>9}{'fake-q %':>10}{'program %':>11}{'loss':>7}{'cycles':>12}{'weights MiB':>13}")
    losses = {}
    for scheme in WEIGHT_SCHEMES:
        variant, config, module_configs = prepare(model, scheme)
        if parse_scheme(scheme)[1]:  # weight transforms: fine-tuned, the zeros and shared levels kept
            _train(variant, data, epochs=2, lr=2e-4)
        row, compiled = measure_scheme(variant, data, "ethos-u55-128", scheme, config, 64, reference=model,
                                       module_configs=module_configs)
        [report] = [d.report for d in compiled.edge.delegates]
        print(f"{scheme:<18}{row.float_accuracy:>9.2f}{row.fake_quant_accuracy:>10.2f}{row.program_accuracy:>11.2f}"
              f"{row.loss:>7.2f}{report.total_cycles:>12,}{report.weights_encoded_bytes / 2**20:>13.3f}", flush=True)
        losses[scheme] = row.loss
    fake, got, report = _qat_a8w4(model, data)
    float_accuracy = row.float_accuracy
    print(f"{'a8w4 QAT':<18}{float_accuracy:>9.2f}{fake:>10.2f}{got:>11.2f}{float_accuracy - got:>7.2f}"
          f"{report.total_cycles:>12,}{report.weights_encoded_bytes / 2**20:>13.3f}", flush=True)
    losses["a8w4 QAT"] = float_accuracy - got
    return losses


def _qat_a8w4(model, data):
    """a8w4 as ExecuTorch means it, quantization-aware: prepare_qat_pt2e with a batch dimension left free (the
    batch norms trained folded into their convolutions), 2 epochs, convert_pt2e; its fake-quantized and program
    top-1 % on ethos-u55-128, and Vela's report."""
    import copy

    import torch
    from torch.export import Dim
    from torchao.quantization.pt2e import move_exported_model_to_eval, move_exported_model_to_train
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e

    from tosakit import EthosUCompileSpec, EthosUQuantizer, get_symmetric_a8w4_quantization_config
    from tosakit.flow import compile
    from tosakit.runtime import LoadedProgram, evaluate_exact

    spec = EthosUCompileSpec("ethos-u55-128")
    quantizer = EthosUQuantizer(spec).set_global(get_symmetric_a8w4_quantization_config())
    exported = torch.export.export(copy.deepcopy(model).train(), (data.train_x[:32],),
                                   dynamic_shapes=({0: Dim("batch", min=1, max=64)},))
    prepared = prepare_qat_pt2e(exported.module(), quantizer)
    move_exported_model_to_train(prepared)
    _train(prepared, data, epochs=2, lr=1e-4, modes=False)
    move_exported_model_to_eval(prepared)
    quantized = convert_pt2e(prepared)
    x = data.test_x
    compiled = compile(torch.export.export(quantized, (x[:1],)), (x[:1],), spec)
    program = LoadedProgram(compiled.program.buffer, "a8w4 QAT program", isolate=False)
    fake = torch.cat([evaluate_exact(quantized, x[i:i + 1])[0] for i in range(len(x))]).argmax(-1)
    got = torch.cat([program.run([x[i:i + 1]])[0] for i in range(len(x))]).argmax(-1)
    top1 = lambda p: 100.0 * float((p == data.test_y).double().mean())  # noqa: E731
    [report] = [d.report for d in compiled.edge.delegates]
    return top1(fake), top1(got), report


def hostile(args) -> None:
    """The untrusted-.pte issue's attacks through `tosakit run` in a fresh process: seconds and peak memory
    to the one-line refusal (the issue's goal: under 1 s and 200 MB each)."""
    import tempfile

    sys.path.insert(0, str(ROOT / "fuzz"))
    from attacks import REPRODUCERS, run_cli, write
    from seeds import build_seeds

    seeds = {p.stem: p for p in build_seeds(OUT / "fuzz-seeds")}
    print(f"{'attack':<16}{'exit':>6}{'seconds':>10}{'peak MB':>10}{'torch loaded':>14}")
    with tempfile.TemporaryDirectory() as folder:
        for name in REPRODUCERS:
            path = write(name, seeds, Path(folder))
            start = time.perf_counter()
            code, imported, _, peak = run_cli(["run", str(path), "--random", "--outputs", str(Path(folder) / "o.npz")])
            print(f"{name:<16}{code:>6}{time.perf_counter() - start:>10.2f}{peak:>10.0f}{imported:>14}")


def cortex_m(args) -> None:
    """The direct Cortex-M flow beside ExecuTorch's: .pte and arena bytes, portable compute, compile seconds."""
    from cortex_m import cortex_m as run

    run(args, OUT, _executorch)


def timing(args) -> None:
    """The simulator's performance model against Vela's estimate: every built-in model on four accelerators,
    whole-network and per operation; published figures reproduced."""
    from timing import timing as run

    run(args)


BENCHES = {"host-runtime": host_runtime, "cortex-m": cortex_m, "hostile": hostile, "accuracy": accuracy, "mv2-snr": mv2_snr, "zoo": zoo,
           "llm": llm, "llm-quality": llm_quality, "weights": weights, "timing": timing}


def main(argv=None) -> int:
    if (argv := sys.argv[1:] if argv is None else argv)[:1] == ["sweep-field"]:  # its own options
        from sweep_field import main as sweep_field
        return sweep_field(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("bench", nargs="*", help=f"which benchmarks: {', '.join(BENCHES)} (default: all); or "
                        "sweep-field alone, with its own options (sweep-field --help)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compare-executorch", action="store_true",
                        help="zoo: also compile with ExecuTorch 1.5.1 (side environment) and print the ratios")
    parser.add_argument("--reuse-executorch", action="store_true",
                        help="zoo: take ExecuTorch's results from the last run's bench/out/executorch.json")
    parser.add_argument("--models", help=f"zoo: comma-separated model names (`tosakit models`, torchvision:NAME, "
                        f"timm:NAME, hf:ORG/NAME) or sets: {', '.join(MODEL_SETS)} (default zoo: {','.join(ZOO)}; "
                        f"field: {','.join(FIELD)})")
    args = parser.parse_args(argv)
    if unknown := [b for b in args.bench if b not in BENCHES]:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHES)}, or sweep-field")
    for name in args.bench or BENCHES:
        print(f"== {name}: {BENCHES[name].__doc__}", flush=True)
        BENCHES[name](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
