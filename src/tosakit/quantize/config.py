"""Quantization configs: how activations, weights and biases become integers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchao.quantization.pt2e.observer import (
    HistogramObserver,
    MinMaxObserver,
    PerChannelMinMaxObserver,
)
from torchao.quantization.pt2e.fake_quantize import FakeQuantize
from torchao.quantization.pt2e.quantizer import DerivedQuantizationSpec, QuantizationSpec

INT8_ACT = (-128, 127)
INT16_ACT = (-32767, 32767)  # symmetric: TOSA's int16 activations have zero point 0
INT8_WEIGHT = (-127, 127)  # symmetric: -128 unused so the range is balanced
INT32_BIAS = (-(2**31), 2**31 - 1)


@dataclass(frozen=True)
class QuantizationConfig:
    """Specs for an op's input activations, output activation, weight and bias."""

    input_activation: QuantizationSpec | None
    output_activation: QuantizationSpec | None
    weight: QuantizationSpec | None
    bias: bool = True  # int32 bias with scale = input scale x weight scale

    @property
    def is_per_channel(self) -> bool:
        return self.weight is not None and self.weight.qscheme == torch.per_channel_symmetric

    def weight_spec(self, ch_axis: int) -> QuantizationSpec | None:
        """The weight spec with the channel axis of this op's weight layout."""
        if self.weight is None or not self.is_per_channel or self.weight.ch_axis == ch_axis:
            return self.weight
        return QuantizationSpec(
            dtype=self.weight.dtype,
            observer_or_fake_quant_ctr=self.weight.observer_or_fake_quant_ctr,
            quant_min=self.weight.quant_min,
            quant_max=self.weight.quant_max,
            qscheme=self.weight.qscheme,
            ch_axis=ch_axis,
            is_dynamic=self.weight.is_dynamic,
        )

    def bias_spec(self, act_edge, weight_edge, per_channel_axis: int = 0) -> DerivedQuantizationSpec | None:
        """int32 bias spec derived from the activation and weight observers."""
        if not self.bias or self.weight is None or self.input_activation is None:
            return None
        return DerivedQuantizationSpec(
            derived_from=[act_edge, weight_edge],
            derive_qparams_fn=_bias_qparams,
            dtype=torch.int32,
            quant_min=INT32_BIAS[0],
            quant_max=INT32_BIAS[1],
            qscheme=torch.per_channel_symmetric if self.is_per_channel else torch.per_tensor_symmetric,
            ch_axis=per_channel_axis if self.is_per_channel else None,
        )


def _bias_qparams(observers) -> tuple[torch.Tensor, torch.Tensor]:
    act_scale, _ = observers[0].calculate_qparams()
    weight_scale, _ = observers[1].calculate_qparams()
    scale = (act_scale * weight_scale).to(torch.float32)
    return scale, torch.zeros_like(scale, dtype=torch.int32)


class PercentileObserver(MinMaxObserver):
    """Range from the 0.01th to the 99.99th percentile of what it sees: outliers are clipped."""

    SAMPLE = 1 << 20  # values kept per batch for the percentile estimate

    def __init__(self, *args, percentile: float = 99.99, **kwargs):
        super().__init__(*args, **kwargs)
        self.percentile = percentile

    def forward(self, x_orig):
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach().float().flatten()
        if x.numel() > self.SAMPLE:
            x = x[torch.randint(0, x.numel(), (self.SAMPLE,), generator=torch.Generator().manual_seed(0))]
        q = torch.tensor([1 - self.percentile / 100, self.percentile / 100])
        lo, hi = torch.quantile(x, q)
        self.min_val.copy_(torch.minimum(self.min_val, lo))
        self.max_val.copy_(torch.maximum(self.max_val, hi))
        return x_orig


class _FiniteRange:
    """An observer whose range leaves out infinities (the -inf a "same" max pool pads with): they quantize to
    the range's ends, as the integer graph computes them."""

    def forward(self, x_orig):
        finite = torch.isfinite(x_orig)
        if x_orig.is_floating_point() and not bool(finite.all()):
            if bool(finite.any()):
                super().forward(x_orig.detach()[finite])
            return x_orig
        return super().forward(x_orig)


class FiniteMinMaxObserver(_FiniteRange, MinMaxObserver):
    """Min/max of the finite values seen."""


class FiniteHistogramObserver(_FiniteRange, HistogramObserver):
    """The histogram search over the finite values seen."""


# How activation ranges are calibrated: min/max, an MSE-optimal histogram search, or percentiles.
OBSERVERS = {
    "minmax": FiniteMinMaxObserver,
    "histogram": FiniteHistogramObserver,
    "percentile": PercentileObserver,
}


def _activation_observer(observer: str, eps: float):
    try:
        return OBSERVERS[observer].with_args(eps=eps)
    except KeyError:
        from ..errors import TosakitError

        raise TosakitError(f"unknown observer {observer!r}", f"choose one of: {', '.join(OBSERVERS)}") from None


def get_symmetric_quantization_config(
    is_per_channel: bool = True,
    is_qat: bool = False,
    is_dynamic: bool = False,
    act_qmin: int = INT8_ACT[0],
    act_qmax: int = INT8_ACT[1],
    weight_qmin: int = INT8_WEIGHT[0],
    weight_qmax: int = INT8_WEIGHT[1],
    observer: str = "minmax",
    eps: float = 2**-16,
) -> QuantizationConfig:
    """int8 symmetric weights (per channel by default), int8 asymmetric activations, int32 bias.

    ``observer`` picks how activation ranges are calibrated: "minmax", "histogram" (the range that
    minimises quantization error, searched over a histogram) or "percentile" (99.99th). ``eps`` is the
    smallest scale an observer gives (ExecuTorch's default): a larger floor would leave a large fan-in
    layer's small weights short of +-127 (wav2letter's 250x32-tap convolution reached only +-121 at 2**-12).
    """
    if is_dynamic:
        from ..errors import TosakitError

        raise TosakitError(
            "dynamic activation quantization is not supported by tosakit's Arm targets",
            "call get_symmetric_quantization_config(is_dynamic=False)",
        )
    act_observer = _activation_observer(observer, eps)
    weight_observer = (PerChannelMinMaxObserver if is_per_channel else MinMaxObserver).with_args(eps=eps)
    if is_qat:  # the spec supplies dtype, range, qscheme and channel axis to the fake-quant
        act_observer = FakeQuantize.with_args(observer=OBSERVERS[observer], eps=eps)
        weight_observer = FakeQuantize.with_args(
            observer=PerChannelMinMaxObserver if is_per_channel else MinMaxObserver, eps=eps
        )
    act = QuantizationSpec(
        dtype=torch.int8,
        observer_or_fake_quant_ctr=act_observer,
        quant_min=act_qmin,
        quant_max=act_qmax,
        qscheme=torch.per_tensor_affine,
    )
    weight = QuantizationSpec(
        dtype=torch.int8,
        observer_or_fake_quant_ctr=weight_observer,
        quant_min=weight_qmin,
        quant_max=weight_qmax,
        qscheme=torch.per_channel_symmetric if is_per_channel else torch.per_tensor_symmetric,
        ch_axis=0 if is_per_channel else None,
    )
    return QuantizationConfig(input_activation=act, output_activation=act, weight=weight)


def get_symmetric_a16w8_quantization_config(is_per_channel: bool = True, is_qat: bool = False,
                                           observer: str = "minmax") -> QuantizationConfig:
    """16x8: int16 symmetric activations, int8 symmetric weights (per channel by default), int32 bias.

    Ethos-U55/U65/U85 run convolutions and matmuls on int16 activations (TOSA's int16 extension);
    the extra 8 bits of activation resolution recover most of what int8 loses on sensitive layers.
    """
    base = get_symmetric_quantization_config(is_per_channel=is_per_channel, is_qat=is_qat, observer=observer)
    act = QuantizationSpec(
        dtype=torch.int16,
        observer_or_fake_quant_ctr=base.input_activation.observer_or_fake_quant_ctr,
        quant_min=INT16_ACT[0],
        quant_max=INT16_ACT[1],
        qscheme=torch.per_tensor_symmetric,
    )
    return QuantizationConfig(input_activation=act, output_activation=act, weight=base.weight)


def get_symmetric_a8w4_quantization_config(is_per_channel: bool = True, is_qat: bool = True,
                                          is_dynamic: bool = False) -> QuantizationConfig:
    """8x4: int8 activations, weights quantized to -7..7 (4 bits, symmetric), int32 bias; quantization-aware
    training by default, as ExecuTorch's. The weights lower as TOSA INT4 where the target has the int4
    extension (every Ethos-U: Vela reads them; their few distinct values also compress to fewer bytes)."""
    return get_symmetric_quantization_config(is_per_channel, is_qat, is_dynamic, weight_qmin=-7, weight_qmax=7)


# The schemes ``tosakit accuracy`` compares, by name.
SCHEMES = {
    "int8": lambda: get_symmetric_quantization_config(is_per_channel=True),
    "int8-per-tensor": lambda: get_symmetric_quantization_config(is_per_channel=False),
    "int8-histogram": lambda: get_symmetric_quantization_config(observer="histogram"),
    "int8-percentile": lambda: get_symmetric_quantization_config(observer="percentile"),
    "a16w8": lambda: get_symmetric_a16w8_quantization_config(),
    "a8w4": lambda: get_symmetric_a8w4_quantization_config(is_qat=False),  # post-training: calibrated, not trained
}
