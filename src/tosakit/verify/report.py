"""What ``--verify`` found, as typed reports and the terminal's text: each output against float PyTorch and
the fake-quantized model, each layer, the quantized delegate inputs that clip, the NPU simulator against the
TOSA reference model."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..runtime.records import EngineComparison
from .npu_ops import NpuOpReport
from .npu_ops import summary as npu_summary

# A layer (or delegate input) that clips more than this share of its values to its integer limits is named,
# with the calibration data as the fix.
SATURATION_NOTABLE = 0.01


@dataclass
class Agreement:
    """How close ``got`` is to a reference: max |error|, SNR, cosine similarity, top-1."""

    max_abs_error: float
    snr_db: float
    cosine: float
    top1: bool | None  # for classifier outputs [N, classes]

    @classmethod
    def of(cls, got: torch.Tensor, ref: torch.Tensor) -> "Agreement":
        g = got.detach().double().flatten()
        r = ref.detach().double().flatten()
        noise = float(((g - r) ** 2).sum())
        signal = float((r ** 2).sum())
        snr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal > 0 else -math.inf)
        denom = float(g.norm() * r.norm())
        cosine = float(g @ r) / denom if denom > 0 else float(noise == 0)
        top1 = None
        if ref.dim() == 2 and ref.shape[-1] > 1 and ref.is_floating_point():
            top1 = bool((got.argmax(-1) == ref.argmax(-1)).all())
        return cls(float((g - r).abs().max()) if g.numel() else 0.0, snr, cosine, top1)


@dataclass
class OutputReport:
    index: int
    shape: tuple[int, ...]
    vs_float: Agreement | None
    vs_fake_quant: Agreement | None


@dataclass
class LayerReport:
    """One op inside a delegate: its TOSA result against the same PyTorch node."""

    delegate: str
    node: str
    target: str
    shape: tuple[int, ...]
    integer: bool
    steps_off: float | None  # integer ops: max difference from the fake-quantized model, in steps
    rel_error: float | None  # float ops: max relative difference from the (exact) reference
    vs_float: Agreement | None  # against the same value in the float model, when it has one
    # integer ops with their own output quantization: the share of values the calibrated range clips to
    # its limits (``limits``, qmin and qmax); None for data movement and float ops
    saturated: float | None = None
    limits: tuple[int, int] | None = None
    # the nearest op or quantized delegate input on the way to this layer (itself included) that clips more
    # than SATURATION_NOTABLE of its values: its loss is in this layer's figures against float
    saturation_source: str | None = None

    @property
    def matches(self) -> bool:
        return (self.steps_off is not None and self.steps_off <= 1) or (
            self.rel_error is not None and self.rel_error <= 1e-4)

    @property
    def saturates(self) -> bool:
        return self.saturated is not None and self.saturated > SATURATION_NOTABLE


@dataclass
class InputReport:
    """A delegate input quantized on the CPU: the share of its values the calibrated range clips."""

    delegate: str
    node: str  # the value quantized (a model input, or the CPU op before the delegate)
    shape: tuple[int, ...]
    saturated: float
    limits: tuple[int, int]

    @property
    def saturates(self) -> bool:
        return self.saturated > SATURATION_NOTABLE


@dataclass
class VerifyReport:
    outputs: list[OutputReport]
    layers: list[LayerReport] = field(default_factory=list)
    quantized_inputs: list[InputReport] = field(default_factory=list)
    # each Ethos-U delegate output the program computed on the NPU simulator, against its TOSA; or why the
    # simulator stopped (the program then ran its delegates' TOSA)
    engines: list[EngineComparison] = field(default_factory=list)
    npu_error: str | None = None
    # each NPU operation of the simulated Ethos-U delegates against the TOSA tensor it computes
    npu_ops: list[NpuOpReport] = field(default_factory=list)
    # where the time goes on the device, estimated: the program run again with its NPU operations timed
    profile: object | None = None  # runtime.profile.ProgramProfile

    @property
    def first_divergent_layer(self) -> LayerReport | None:
        return next((layer for layer in self.layers if not layer.matches), None)

    def _agreement_text(self) -> str:
        """No layer diverges: whether the outputs agree too (layers one step off can add up to outputs that do not)."""
        diff = max((o.vs_fake_quant.max_abs_error for o in self.outputs if o.vs_fake_quant), default=0.0)
        if diff == 0:
            return "every layer matches the fake-quantized model"
        off = [layer.node for layer in self.layers if layer.steps_off]
        where = (f"{len(off)} layer(s) round one step away from it ({', '.join(off[:5])}"
                 f"{', ...' if len(off) > 5 else ''}) and the layers after them carry that on" if off
                 else "every delegate layer matches it, so the difference comes from the ops on the CPU")
        return (f"the outputs differ from the fake-quantized model (max |err| {diff:.4g}) though no layer is more "
                f"than one step from it given the same inputs: {where}")

    @property
    def saturated(self) -> list[InputReport | LayerReport]:
        """Delegate inputs, then layers, that clip more than SATURATION_NOTABLE of their values."""
        return [i for i in self.quantized_inputs if i.saturates] + [layer for layer in self.layers if layer.saturates]

    def saturation_hint(self) -> str | None:
        """One line naming what saturates, with the fix; None when nothing does."""
        named = self.saturated
        if not named:
            return None
        parts = [f"{'input ' if isinstance(s, InputReport) else ''}{s.node} ({share_text(s.saturated)})" for s in named[:4]]
        if len(named) > 4:
            parts.append(f"{len(named) - 4} more")
        listed = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
        kinds = {limits_name(s.limits) for s in named}
        limits = f"the {kinds.pop()} limits" if len(kinds) == 1 else "their integer limits"
        return (f"{listed} clip{'s' if len(named) == 1 else ''} values at {limits}: the calibration data does "
                "not cover the inputs verified; "
                "calibrate on representative samples (--calibration PATH)")

    def saturation_note(self, layer: LayerReport) -> str:
        """Why this layer's figures against float may be poor, when values were clipped on its way."""
        if layer.saturation_source is None:
            return ""
        if layer.saturation_source == layer.node and layer.saturates:
            return f"saturated: {share_text(layer.saturated)} of its values at the {limits_name(layer.limits)} limits"
        inputs = {i.node for i in self.quantized_inputs}
        where = f"input {layer.saturation_source}" if layer.saturation_source in inputs else layer.saturation_source
        return f"after saturation at {where}"

    def table(self) -> str:
        """The per-output table for the terminal."""
        width = max([18] + [len(f"{o.index} {list(o.shape)}") + 2 for o in self.outputs])  # long shapes widen it
        lines = [f"{'output':<{width}}{'reference':<14}{'max |err|':>12}{'SNR dB':>9}{'cosine':>10}{'top-1':>7}"]
        for o in self.outputs:
            for name, a in (("float", o.vs_float), ("fake-quant", o.vs_fake_quant)):
                if a is None:
                    continue
                top = "-" if a.top1 is None else ("yes" if a.top1 else "NO")
                lines.append(f"{f'{o.index} {list(o.shape)}':<{width}}{name:<14}{a.max_abs_error:>12.4g}"
                             f"{_db(a.snr_db):>9}{a.cosine:>10.5f}{top:>7}")
        if self.npu_error:
            lines.append(f"delegates' own payloads (NPU simulator, vgf engine): stopped ({self.npu_error}); the "
                         f"figures above are the delegates' TOSA on the reference model")
        for backend, (what, engine) in ENGINE_LINES.items():
            ran = [c for c in self.engines if c.backend == backend]
            if ran:
                exact = sum(c.bit_exact for c in ran)
                lines.append(f"{what}: {exact} of {len(ran)} delegate output(s) bit-exact with their TOSA on the "
                             f"reference model")
                lines += [f"  {engine} vs tosa: {c}" for c in ran if not c.bit_exact]
        if self.npu_ops:
            lines += npu_summary(self.npu_ops)
        if self.layers:
            bad = self.first_divergent_layer
            worst = min((layer for layer in self.layers if layer.vs_float), key=lambda l: l.vs_float.snr_db,
                        default=None)
            lines.append(f"layers checked: {len(self.layers)}; "
                         + (f"first divergent from the fake-quantized model: {bad.node} ({bad.target})" if bad
                            else self._agreement_text()))
            if worst is not None:
                note = self.saturation_note(worst)
                lines.append(f"lowest SNR against float: {worst.node} ({worst.target}) {_db(worst.vs_float.snr_db)} dB"
                             + (f" ({note})" if note else ""))
        for s in self.saturated[:8]:
            snr = (f", SNR against float {_db(s.vs_float.snr_db)} dB"
                   if isinstance(s, LayerReport) and s.vs_float is not None else "")
            lines.append(f"saturated: {_what(s)}: {share_text(s.saturated)} of its values at the "
                         f"{limits_name(s.limits)} limits{snr}")
        if len(self.saturated) > 8:
            lines.append(f"saturated: {len(self.saturated) - 8} more (see the per-layer report)")
        hint = self.saturation_hint()
        if hint:
            lines.append("hint: " + hint)
        return "\n".join(lines)


# The engines a delegate's own payload runs on, by backend: what the verify line calls them.
ENGINE_LINES = {"EthosUBackend": ("Ethos-U command streams run on the NPU simulator", "npu"),
                "VgfBackend": ("VGF payloads run on Arm's ML SDK (the vgf engine)", "vgf")}


def _what(s: InputReport | LayerReport) -> str:
    return f"input {s.node}" if isinstance(s, InputReport) else f"{s.node} ({s.target})"


def share_text(share: float) -> str:
    """A share of values as a percentage: 0.0042 -> 0.42%, 0.31 -> 31%."""
    return f"{100 * share:.2g}%" if share < 0.1 else f"{100 * share:.0f}%"


def limits_name(limits: tuple[int, int] | None) -> str:
    """(-128, 127) -> int8; other ranges as [qmin, qmax]."""
    if limits is None:
        return "integer"
    for bits in (8, 16, 32):
        if tuple(limits) == (-(1 << (bits - 1)), (1 << (bits - 1)) - 1):
            return f"int{bits}"
    return f"[{limits[0]}, {limits[1]}]"


def _db(x: float) -> str:
    return "inf" if math.isinf(x) and x > 0 else f"{x:.1f}"
