"""Quantization configs: how activations, weights and biases become integers."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchao.quantization.pt2e.observer import (
    MinMaxObserver,
    PerChannelMinMaxObserver,
)
from torchao.quantization.pt2e.fake_quantize import FakeQuantize
from torchao.quantization.pt2e.quantizer import DerivedQuantizationSpec, QuantizationSpec

INT8_ACT = (-128, 127)
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


def get_symmetric_quantization_config(
    is_per_channel: bool = True,
    is_qat: bool = False,
    is_dynamic: bool = False,
    act_qmin: int = INT8_ACT[0],
    act_qmax: int = INT8_ACT[1],
    weight_qmin: int = INT8_WEIGHT[0],
    weight_qmax: int = INT8_WEIGHT[1],
) -> QuantizationConfig:
    """int8 symmetric weights (per channel by default), int8 asymmetric activations, int32 bias."""
    if is_dynamic:
        from ..errors import TosakitError

        raise TosakitError(
            "dynamic activation quantization is not supported by tosakit's Arm targets",
            "call get_symmetric_quantization_config(is_dynamic=False)",
        )
    act_observer = MinMaxObserver.with_args(eps=2.0**-12)
    weight_observer = (PerChannelMinMaxObserver if is_per_channel else MinMaxObserver).with_args(eps=2.0**-12)
    if is_qat:  # the spec supplies dtype, range, qscheme and channel axis to the fake-quant
        act_observer = FakeQuantize.with_args(observer=MinMaxObserver, eps=2.0**-12)
        weight_observer = FakeQuantize.with_args(
            observer=PerChannelMinMaxObserver if is_per_channel else MinMaxObserver, eps=2.0**-12
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
