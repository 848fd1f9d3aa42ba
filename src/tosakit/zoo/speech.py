"""Speech networks after torchaudio's architectures (torchaudio itself has no release that installs beside
torch 2.13.0's CPU wheel), random weights: Wav2Letter (a stack of 1-D convolutions, log-softmax over the letters)
and a Conformer encoder (feed-forward halves around self-attention and a gated depthwise convolution)."""

from __future__ import annotations

import torch
from torch import nn

from ._init import init_weights

# Wav2Letter's acoustic model after its input layer: (output channels, kernel, stride, padding).
_WAV2LETTER = ((250, 48, 2, 23), *((250, 7, 1, 3),) * 7, (2000, 32, 1, 16), (2000, 1, 1, 0))


class Wav2Letter(nn.Module):
    """torchaudio's Wav2Letter layout on spectral features (its power-spectrum input, without the waveform front
    end): 1-D convolutions of 48 (stride 2), 7x7, 32 and 1, each followed by ReLU, to ``classes`` letters;
    log-softmax over them."""

    def __init__(self, classes: int = 40, features: int = 1):
        super().__init__()
        layers, cin = [], features
        for cout, kernel, stride, padding in (*_WAV2LETTER, (classes, 1, 1, 0)):
            layers += [nn.Conv1d(cin, cout, kernel, stride, padding), nn.ReLU()]
            cin = cout
        self.acoustic_model = nn.Sequential(*layers)

    def forward(self, x):
        return torch.log_softmax(self.acoustic_model(x), dim=1)


class _FeedForward(nn.Module):
    """Layer norm, a SiLU MLP; its output is added at half weight."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, hidden), nn.SiLU(), nn.Linear(hidden, dim))

    def forward(self, x):
        return x + 0.5 * self.net(x)


class _Convolution(nn.Module):
    """Layer norm, pointwise convolution to twice the width, GLU, depthwise convolution, batch norm, SiLU,
    pointwise convolution; added to its input."""

    def __init__(self, dim: int, kernel: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.net = nn.Sequential(nn.Conv1d(dim, 2 * dim, 1), nn.GLU(dim=1),
                                 nn.Conv1d(dim, dim, kernel, padding=(kernel - 1) // 2, groups=dim),
                                 nn.BatchNorm1d(dim), nn.SiLU(), nn.Conv1d(dim, dim, 1))

    def forward(self, x):  # [B, T, D]
        return x + self.net(self.norm(x).transpose(1, 2)).transpose(1, 2)


class ConformerLayer(nn.Module):
    """Feed-forward half, self-attention (padded frames masked as keys), convolution, feed-forward half, layer
    norm: torchaudio's order with convolution after attention."""

    def __init__(self, dim: int, heads: int, hidden: int, kernel: int):
        super().__init__()
        self.ffn1, self.ffn2 = _FeedForward(dim, hidden), _FeedForward(dim, hidden)
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.convolution = _Convolution(dim, kernel)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x, padding):
        x = self.ffn1(x)
        y = self.attention_norm(x)
        x = x + self.attention(y, y, y, key_padding_mask=padding, need_weights=False)[0]
        return self.norm(self.ffn2(self.convolution(x)))


class Conformer(nn.Module):
    """A Conformer encoder over [B, T, D] features with each sequence's length: frames at or past it are padding
    (the mask torchaudio makes, against the input's own length, which the longest sequence fills). Returns the
    encoded features (torchaudio also returns the lengths, unchanged)."""

    def __init__(self, dim: int = 16, heads: int = 4, hidden: int = 64, layers: int = 2, kernel: int = 31):
        super().__init__()
        self.layers = nn.ModuleList(ConformerLayer(dim, heads, hidden, kernel) for _ in range(layers))

    def forward(self, x, lengths):
        padding = torch.arange(x.shape[1], device=x.device)[None, :] >= lengths[:, None]
        for layer in self.layers:
            x = layer(x, padding)
        return x


def wav2letter():
    """Wav2Letter on a 128-sample power spectrum (ExecuTorch's Ethos-U test takes 400: the same network, a third
    of the positions), 40 letters."""
    torch.manual_seed(0)
    inputs = (torch.randn(1, 1, 128),)
    return init_weights(Wav2Letter(), 0, torch.randn(8, 1, 128)), inputs


def conformer():
    """A 2-layer Conformer (16 features, 4 heads, 64 hidden, kernel 31) over 2 sequences of up to 24 frames."""
    torch.manual_seed(0)
    inputs = (torch.randn(2, 24, 16), torch.tensor([24, 17], dtype=torch.int32))
    calibration = (torch.randn(8, 24, 16), torch.full((8,), 24, dtype=torch.int32))
    return init_weights(Conformer(), 0, *calibration), inputs
