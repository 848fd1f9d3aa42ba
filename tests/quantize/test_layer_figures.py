"""Per-layer figures with known answers (issue 13): the SNR a layer shows against float is the error of
that layer's own value, and the share of values its calibrated range clips is counted and named.

What the issue saw (an attention block's ``bmm`` at -5.1 dB with cosine 0.995) was pairing: the quantizer
scales attention scores after ``q @ k^T`` where the float graph scaled ``q`` before, so the float value
paired with the layer was the same direction at another magnitude. Layers are now compared with the
quantizer's own float graph, paired by what they compute (see ``tosakit.verify``)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from tosakit.flow import compile
from tosakit.report import write_layers_csv
from tosakit.verify.run import verify

pytestmark = pytest.mark.numerics


class Identity(nn.Module):
    """A linear layer whose weight is the identity: int8 weight 127 at scale 1/127, exactly 1.0."""

    def __init__(self, n=64):
        super().__init__()
        self.fc = nn.Linear(n, n, bias=False)
        with torch.no_grad():
            self.fc.weight.copy_(torch.eye(n))

    def forward(self, x):
        return self.fc(x)


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x):
        return self.mha(x, x, x, need_weights=False)[0]


def _verified(model, calibration, inputs):
    c = compile(model.eval(), inputs, "ethos-u55-128", quantize=True, calibration=calibration)
    return verify(c.edge, c.program, inputs, float_model=model, fake_quant=c.quantized, layers=True)


def _uniform(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g) * 2 - 1


def test_identity_layer_shows_the_rounding_noise_of_its_step():
    """Uniform values on [-1, 1] quantized with step 2/255 carry noise of variance step²/12: the layer's SNR
    against float is 10·log10((1/3) / (step²/12)) = 48.1 dB, and nothing saturates."""
    model = Identity()
    calibration = [(torch.linspace(-1, 1, 256 * 64).reshape(1, 256, 64),)]
    report = _verified(model, calibration, (_uniform((1, 256, 64), seed=1),))
    (layer,) = [row for row in report.layers if row.target == "aten.linear.default"]
    expected = 10 * math.log10((1 / 3) / ((2 / 255) ** 2 / 12))
    assert layer.matches and abs(layer.vs_float.snr_db - expected) < 0.5, (layer.vs_float, expected)
    assert layer.saturated == 0 and not report.saturated and report.saturation_hint() is None


def _three_eighths_at(x: torch.Tensor, value: float) -> torch.Tensor:
    """``x`` with exactly 3/16 of its elements (along the last-but-one axis) set to +value, 3/16 to -value."""
    n = x.shape[-2]
    x[..., : 3 * n // 16, :] = value
    x[..., 3 * n // 16: 6 * n // 16, :] = -value
    return x


def test_input_saturation_is_counted_exactly():
    """Calibrated on [-1, 1], verified on values of which exactly 3/8 lie at ±1.5: the input reports 37.5%
    clipped at the int8 limits; the layer fed the clipped integers clips nothing itself and says where its
    loss came from."""
    calibration = [(torch.linspace(-1, 1, 256 * 64).reshape(1, 256, 64),)]
    x = _three_eighths_at(_uniform((1, 256, 64), seed=2) * 0.5, 1.5)
    report = _verified(Identity(), calibration, (x,))
    assert [(i.node, i.saturated, i.limits) for i in report.quantized_inputs] == [("x", 0.375, (-128, 127))]
    (layer,) = [row for row in report.layers if row.target == "aten.linear.default"]
    assert layer.saturated == 0 and layer.saturation_source == "x"
    assert report.saturation_note(layer) == "after saturation at input x"
    assert "saturated: input x: 38% of its values at the int8 limits" in report.table()
    assert "--calibration PATH" in report.saturation_hint()


class Sum(nn.Module):
    """y = x0 + x1, a linear layer with weight [1, 1]."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 1, bias=False)
        with torch.no_grad():
            self.fc.weight.fill_(1.0)

    def forward(self, x):
        return self.fc(x)


def test_layer_saturation_is_counted_exactly(tmp_path):
    """Calibrated where x1 = -x0/2 (outputs within ±0.5), verified where x1 = x0 with 3/8 of the rows at
    ±0.75 (outputs ±1.5): the inputs clip nothing, the layer clips exactly 37.5% at the int8 limits, names
    itself, and the CSV carries the share and the limits."""
    a = torch.linspace(-1, 1, 256).reshape(1, 256, 1)
    calibration = [(torch.cat([a, -a / 2], dim=-1),)]
    b = _three_eighths_at(_uniform((1, 256, 1), seed=3) * 0.2, 0.75)
    report = _verified(Sum(), calibration, (torch.cat([b, b], dim=-1),))
    assert [i.saturated for i in report.quantized_inputs] == [0.0]
    (layer,) = [row for row in report.layers if row.target == "aten.linear.default"]
    assert (layer.saturated, layer.limits, layer.saturation_source) == (0.375, (-128, 127), layer.node)
    assert report.saturation_note(layer) == "saturated: 38% of its values at the int8 limits"
    hint = report.saturation_hint()
    assert hint.startswith(f"{layer.node} (38%) ") and "int8" in hint and "--calibration PATH" in hint, hint
    write_layers_csv(tmp_path / "layers.csv", report.layers)
    header, *rows = (tmp_path / "layers.csv").read_text().splitlines()
    row = dict(zip(header.split(","), next(r for r in rows if "aten.linear.default" in r).split(",")))
    assert (float(row["saturated"]), row["qmin"], row["qmax"]) == (0.375, "-128", "127"), row


@pytest.fixture(scope="module")
def attention():
    torch.manual_seed(0)
    return Attention().eval()


def _cosine_snr(cosine: float) -> float:
    """The SNR a value at the right magnitude shows for a given cosine: -10·log10(1 - cos²)."""
    return -10 * math.log10(max(1 - cosine * cosine, 1e-12))


def test_attention_figures_agree_with_their_cosine(attention):
    """The issue's case: calibrated on 64 samples, verified on an unseen one, every layer's SNR against float
    is what its cosine says (within 3 dB; a misaligned pair shows far less), bmm included, and none clips."""
    calibration = [(torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(s)),) for s in range(64)]
    report = _verified(attention, calibration, (torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(99)),))
    rows = [r for r in report.layers if r.vs_float is not None and r.vs_float.cosine < 0.99999]
    assert {r.target for r in rows} >= {"aten.bmm.default", "aten.linear.default", "aten.exp.default"}
    for r in rows:
        assert r.matches and abs(r.vs_float.snr_db - _cosine_snr(r.vs_float.cosine)) < 3, r
    bmm = [r for r in rows if r.target == "aten.bmm.default"]
    assert len(bmm) == 2 and min(r.vs_float.snr_db for r in bmm) > 15, bmm
    assert not [r for r in report.layers if r.saturates], report.table()
    assert report.outputs[0].vs_float.snr_db > 20


def test_attention_calibrated_on_a_tenth_names_what_clips(attention):
    """Calibrated on one sample at a tenth of the scale: the input and the bmm layers are named as clipping,
    the layers after them say where the loss came from, and the hint names the fix."""
    x = torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(5))
    report = _verified(attention, [(x * 0.1,)], (x,))
    assert report.quantized_inputs and report.quantized_inputs[0].saturated > 0.5
    clipped = {r.node for r in report.layers if r.saturates}
    assert {"bmm", "bmm_1"} <= clipped, clipped
    after = [r for r in report.layers if r.saturation_source is not None and not r.saturates]
    assert after and all(report.saturation_note(r).startswith("after saturation at ") for r in after)
    assert "--calibration PATH" in report.saturation_hint()
