"""Quantization accuracy, measured: float vs fake-quantized vs the lowered program on the host, per scheme."""

from __future__ import annotations

import copy
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn

from .errors import TosakitError
from .flow import compile, quantize_model
from .partition import cpu_compute
from .quantize.config import SCHEMES
from .quantize.qdq import is_dequantize, is_quantize
from .runtime import LoadedProgram, evaluate_exact
from .runtime.delegates import ExactInterpreter
from .specs import compile_spec_for_target
from .verify.report import Agreement, VerifyReport
from .verify.run import verify
from .zoo.trained import Split


@dataclass
class SchemeAccuracy:
    """One quantization scheme on held-out data."""

    scheme: str
    float_accuracy: float  # top-1 %, the float model (evaluated in float64)
    fake_quant_accuracy: float  # the fake-quantized (convert_pt2e) model, evaluated exactly
    program_accuracy: float  # the lowered .pte, run on the host
    output_snr_db: float  # the program's outputs against float, over the whole test set
    cpu_ops: int  # compute ops left on the CPU
    seconds: float
    layers: VerifyReport | None = None  # per layer, on the first test sample
    agreement: float = 100.0  # % of samples where the program predicts what the fake-quantized model does

    @property
    def loss(self) -> float:
        """Accuracy points lost from float to the program."""
        return self.float_accuracy - self.program_accuracy


def _schemes(names: list[str]) -> list[str]:
    unknown = [n for n in names if n not in SCHEMES]
    if unknown:
        raise TosakitError(f"unknown quantization scheme(s) {', '.join(unknown)}", f"choose from {', '.join(SCHEMES)}")
    return names


def _top1(logits: torch.Tensor, labels: torch.Tensor) -> float:
    return 100.0 * float((logits.argmax(-1) == labels).float().mean())


def measure(model: nn.Module, data: Split, target: str, schemes: list[str], calibration: int | list[tuple] = 64,
            limit: int | None = None, layers: bool = False) -> list[SchemeAccuracy]:
    """Quantize ``model`` with each scheme (calibrated on ``calibration`` training samples, or on the samples
    given), lower it for ``target``, and compare the three models' accuracy on the held-out split (``limit``
    samples at most). Float and fake-quantized models are evaluated in float64 (exactly), so that no
    figure hinges on float summation order; the program's integers are exact by nature."""
    rows = []
    for scheme in _schemes(schemes):
        rows.append(measure_scheme(model, data, target, scheme, SCHEMES[scheme](), calibration, limit, layers)[0])
        print(f"  {scheme}: {rows[-1].program_accuracy:.2f}% in {rows[-1].seconds:.1f} s", file=sys.stderr, flush=True)
    return rows


def measure_scheme(model: nn.Module, data: Split, target: str, scheme: str, config, calibration: int | list[tuple] = 64,
                   limit: int | None = None, layers: bool = False, reference: nn.Module | None = None,
                   module_configs: dict | None = None):
    """``measure`` for one scheme named ``scheme``, quantized with ``config`` (``module_configs`` for the modules
    they name); its row and the compiled program. ``reference``: the float model to measure against (the model
    before weight transforms; default ``model``)."""
    model = model.eval()
    x, y = data.test_x[:limit], data.test_y[:limit]
    samples = data.calibration(calibration) if isinstance(calibration, int) else list(calibration)
    twin = copy.deepcopy(reference if reference is not None else model).eval().double()
    with torch.no_grad():
        float_logits = torch.cat([twin(x[i:i + 1].double()) for i in range(len(x))]).float()
    start = time.perf_counter()
    spec = compile_spec_for_target(target).with_debug_info()
    compiled = compile(model, (x[:1],), spec, quantize=True, config=config, calibration=samples,
                       module_configs=module_configs)
    program = LoadedProgram(compiled.program.buffer, f"{scheme} program", isolate=False)
    fake = torch.cat([evaluate_exact(compiled.quantized, x[i:i + 1])[0] for i in range(len(x))])
    got = torch.cat([program.run([x[i:i + 1]])[0] for i in range(len(x))])
    cpu = cpu_compute(compiled.edge.placements)
    report = verify(compiled.edge, compiled.program, (x[:1],), model, compiled.quantized, layers=True) \
        if layers else None
    agree = 100.0 * float((got.argmax(-1) == fake.argmax(-1)).double().mean())
    row = SchemeAccuracy(scheme, _top1(float_logits, y), _top1(fake, y), _top1(got, y),
                         Agreement.of(got, float_logits).snr_db, len(cpu), time.perf_counter() - start, report, agree)
    return row, compiled


def output_snr(model: nn.Module, calibration: list[tuple], evaluation: list[tuple], target: str,
               schemes: list[str], weights_only: bool = False) -> dict[str, float]:
    """Per scheme: SNR (dB) of the fake-quantized model's outputs against float, over ``evaluation``.

    ``weights_only``: the error of the scheme's weight (and bias) quantization alone, activations left in
    float64. Where schemes differ only in their weights, this compares them in a figure that float
    summation order cannot move: with activations quantized, which values fall on the other side of a
    rounding tie depends on the order the float calibration summed in, and a deep network amplifies each
    such flip."""
    model = model.eval()
    with torch.no_grad():
        reference = torch.cat([model(*e) for e in evaluation])
    out = {}
    for scheme in _schemes(schemes):
        quantized = quantize_model(model, evaluation[0], compile_spec_for_target(target), SCHEMES[scheme](),
                                   calibration)
        if weights_only:
            with torch.no_grad():
                got = torch.cat([_WeightsOnly(quantized).run(*e) for e in evaluation])
        else:
            got = torch.cat([evaluate_exact(quantized, *e)[0] for e in evaluation])
        out[scheme] = Agreement.of(got, reference).snr_db
    return out


class _WeightsOnly(ExactInterpreter):
    """``ExactInterpreter`` with every activation quantize/dequantize pair passing its float64 input on:
    only the constants (weights, biases) stay quantized."""

    def call_function(self, target, args, kwargs):
        n = self._node
        if is_quantize(n):
            return args[0].double()
        if is_dequantize(n) and n.args[0].op == "call_function":  # of an activation (constants are get_attr)
            return args[0]
        return super().call_function(target, args, kwargs)


def table(rows: list[SchemeAccuracy]) -> str:
    """The per-scheme table for the terminal."""
    lines = [f"{'scheme':<17}{'float %':>9}{'fake-quant %':>14}{'program %':>11}{'loss':>7}{'SNR dB':>8}"
             f"{'agree %':>9}{'CPU ops':>9}"]
    for r in rows:
        lines.append(f"{r.scheme:<17}{r.float_accuracy:>9.2f}{r.fake_quant_accuracy:>14.2f}{r.program_accuracy:>11.2f}"
                     f"{r.loss:>7.2f}{r.output_snr_db:>8.1f}{r.agreement:>9.2f}{r.cpu_ops:>9}")
    lines.append("agree %: held-out samples where the program predicts the class the fake-quantized model does")
    return "\n".join(lines)
