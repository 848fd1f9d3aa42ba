"""``tosakit demo`` (``make demo``): the Arm tutorial's programs and a trained model, compiled, run on the
host and judged on what tosakit controls.

Each program is judged against the PyTorch model it must reproduce: a float program against the float
model (80 dB: errors of 1e-4 of the signal); a quantized one against the fake-quantized model (``convert_pt2e``),
every delegated layer within one step of the fake-quantized layer fed the same integers, and its outputs
far closer to that model (20 dB) than any wiring error could be. How far quantization itself moves the
outputs from float is information, not a verdict: on a random-weight network it says nothing about
tosakit. The trained ``digits`` CNN shows what it means: float, fake-quantized and program accuracy on
held-out images, and how often the program predicts what the fake-quantized model does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from .compile_job import CompileOptions, compile_model, default_output_name
from .report import summary

# (model, target, delegate, quantize): the tutorial's programs
TUTORIAL = (
    ("softmax", "ethos-u55-128", False, False),
    ("add", "ethos-u55-128", True, False),
    ("mv2", "ethos-u55-128", True, True),
    ("mv2", "ethos-u85-256", True, True),
    ("add", "vgf", True, False),
    ("mv2", "vgf", True, True),
)
FLOAT_SNR_DB = 80.0  # a float program's outputs against the float model: 1e-4 of the signal
WIRING_SNR_DB = 20.0  # a quantized program's outputs against the fake-quantized model
AGREEMENT = 99.0  # % of held-out predictions the trained model's program shares with the fake-quantized model


@dataclass
class Verdict:
    """One demo program: what it was judged against, whether it holds, and the figures that say so."""

    name: str
    judged_against: str
    ok: bool
    figures: str
    information: str = ""


def judge(name: str, verification, quantized: bool) -> Verdict:
    """A compiled program's verdict from its ``VerifyReport``."""
    if not quantized:
        snrs = [o.vs_float.snr_db for o in verification.outputs if o.vs_float is not None]
        snr = min(snrs) if len(snrs) == len(verification.outputs) else float("-inf")
        worst = max(o.vs_float.max_abs_error for o in verification.outputs if o.vs_float is not None) if snrs else 0
        return Verdict(name, "float PyTorch", snr >= FLOAT_SNR_DB,
                       f"outputs {_db(snr)} dB from it (max |error| {worst:.2g})")
    layers = verification.layers
    bad = verification.first_divergent_layer
    snrs = [o.vs_fake_quant.snr_db for o in verification.outputs if o.vs_fake_quant is not None]
    snr = min(snrs) if snrs else float("-inf")
    ok = bool(layers) and bad is None and snr >= WIRING_SNR_DB
    figures = (f"{sum(layer.matches for layer in layers)} of {len(layers)} layers within one step; "
               f"outputs {_db(snr)} dB from the fake-quantized model")
    if bad is not None:
        figures += f"; first divergent layer {bad.node} ({bad.target})"
    floats = [o.vs_float.snr_db for o in verification.outputs if o.vs_float is not None]
    info = f"quantization error: {_db(min(floats))} dB SNR against float" if floats else ""
    return Verdict(name, "fake-quantized model", ok, figures, info)


def _db(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.1f}"


def tutorial(out: Path) -> list[Verdict]:
    """Compile, verify (per layer) and judge the tutorial's programs."""
    verdicts = []
    for model, target, delegate, quantize in TUTORIAL:
        name = default_output_name(model, target, delegate)
        print(f"\n== {name}", flush=True)
        folder = out / name.removesuffix(".pte")
        opts = CompileOptions(model, target, delegate, quantize, output=str(out / name), intermediates=str(folder),
                              verify=True, quiet=True)
        start = time.perf_counter()
        run = compile_model(opts)
        print(summary(run.output, run.edge, run.program, time.perf_counter() - start))
        if run.calibrated_on:
            print(f"calibrated on {run.calibrated_on}")
        print(f"verified on {run.verified_on}")
        print(run.verification.table())
        verdicts.append(judge(name, run.verification, quantize))
        print(f"{'ok' if verdicts[-1].ok else 'DIFFERS'}: against the {verdicts[-1].judged_against}, "
              f"{verdicts[-1].figures}")
        print(f"report: {folder / 'report.html'}")
    return verdicts


def trained(out: Path, target: str = "ethos-u55-128") -> Verdict:
    """The trained digits CNN, int8 for ``target``: float, fake-quantized and program accuracy on held-out
    images, with the per-layer report."""
    from .accuracy import measure, table
    from .report import write_accuracy_html
    from .zoo.trained import digits, digits_data

    data = digits_data()
    print(f"\n== digits: a CNN trained on scikit-learn's 8x8 digits, int8 for {target}, calibrated on 64 "
          f"training images, judged on {len(data.test_x)} held-out ones", flush=True)
    model, _ = digits()
    [row] = measure(model, data, target, ["int8"], 64, layers=True)
    print(table([row]))
    folder = out / "digits"
    folder.mkdir(parents=True, exist_ok=True)
    write_accuracy_html(folder / "report.html", f"digits accuracy on {target}", [row])
    agreed = round(row.agreement * len(data.test_x) / 100)
    verdict = Verdict(f"digits int8 on {target}", "fake-quantized model",
                      row.agreement >= AGREEMENT and row.cpu_ops == 0,
                      f"{agreed} of {len(data.test_x)} predictions agree",
                      f"accuracy: float {row.float_accuracy:.2f}%, fake-quantized {row.fake_quant_accuracy:.2f}%, "
                      f"program {row.program_accuracy:.2f}%")
    print(f"{'ok' if verdict.ok else 'DIFFERS'}: {verdict.figures}; {verdict.information}")
    print(f"report: {folder / 'report.html'}")
    return verdict


def run(out: Path) -> int:
    """The whole demo; 0 when every program reproduces what it is judged against."""
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    verdicts = tutorial(out) + [trained(out)]
    print(f"\n{'program':<38}{'judged against':<22}result")
    for v in verdicts:
        print(f"{v.name:<38}{v.judged_against:<22}{'ok' if v.ok else 'DIFFERS'}: {v.figures}")
        if v.information:
            print(f"{'':<60}{v.information}")
    failed = [v for v in verdicts if not v.ok]
    print(f"\n{len(verdicts) - len(failed)} of {len(verdicts)} programs reproduce their PyTorch model "
          f"({time.perf_counter() - start:.0f} s); reports in {out}/*/report.html")
    return 1 if failed else 0
