"""Models trained in seconds on data that needs no download, to measure quantization accuracy.

- ``digits``: a small CNN on the 8x8 handwritten digits scikit-learn ships (1,797 images).
- ``waves``: a 1-D conv net classifying synthetic signals (sine, square, sawtooth, chirp, noise
  bursts) generated deterministically.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import nn


@dataclass(frozen=True)
class Split:
    """Held-out evaluation data: inputs [N, ...] and integer labels [N]."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor

    def calibration(self, count: int = 64) -> list[tuple[torch.Tensor]]:
        """The first ``count`` training samples, one batch-1 tuple each."""
        return [(self.train_x[i:i + 1],) for i in range(min(count, len(self.train_x)))]


def _split(x: np.ndarray, y: np.ndarray, seed: int, test_fraction: float = 0.25) -> Split:
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(len(x) * (1 - test_fraction))
    tr, te = order[:cut], order[cut:]
    as_x = lambda a: torch.from_numpy(a.astype(np.float32))  # noqa: E731
    as_y = lambda a: torch.from_numpy(a.astype(np.int64))  # noqa: E731
    return Split(as_x(x[tr]), as_y(y[tr]), as_x(x[te]), as_y(y[te]))


@lru_cache(maxsize=None)
def digits_data(seed: int = 0) -> Split:
    """scikit-learn's digits as [N, 1, 8, 8] in 0..1, split 75/25."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return _split(digits.images[:, None] / 16.0, digits.target, seed)


WAVE_KINDS = ("sine", "square", "sawtooth", "chirp", "bursts")


@lru_cache(maxsize=None)
def waves_data(seed: int = 0, per_class: int = 300, length: int = 128) -> Split:
    """Synthetic 1-D signals [N, 1, length]: five waveform kinds, random frequency, phase, noise."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0, 1, length, endpoint=False)
    xs, ys = [], []
    for label, kind in enumerate(WAVE_KINDS):
        for _ in range(per_class):
            f, phase = rng.uniform(3, 9), rng.uniform(0, 2 * np.pi)
            if kind == "sine":
                x = np.sin(2 * np.pi * f * t + phase)
            elif kind == "square":
                x = np.sign(np.sin(2 * np.pi * f * t + phase))
            elif kind == "sawtooth":
                x = 2 * ((f * t + phase / (2 * np.pi)) % 1) - 1
            elif kind == "chirp":
                x = np.sin(2 * np.pi * (f * t + 8 * t * t) + phase)
            else:
                x = (rng.random(length) < 0.08) * rng.uniform(-1, 1, length) * 3
            xs.append(x + rng.normal(0, 1.0, length))
            ys.append(label)
    return _split(np.stack(xs)[:, None], np.array(ys), seed)


class DigitsCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.classifier = nn.Linear(64, 10)

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


class WavesNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 16, 7, padding=3), nn.BatchNorm1d(16), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(16, 32, 5, padding=2), nn.BatchNorm1d(32), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(32, 32, 5, padding=2), nn.BatchNorm1d(32), nn.ReLU(), nn.AdaptiveAvgPool1d(1),
        )
        self.classifier = nn.Linear(32, len(WAVE_KINDS))

    def forward(self, x):
        return self.classifier(torch.flatten(self.features(x), 1))


def train(model: nn.Module, data: Split, epochs: int, seed: int = 0, lr: float = 3e-3) -> nn.Module:
    """Adam on mini-batches of 32; deterministic for a seed."""
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(data.train_x))
        for i in range(0, len(order), 32):
            idx = order[i:i + 32]
            opt.zero_grad()
            nn.functional.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
            opt.step()
    return model.eval()


def accuracy(predict, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy in percent of ``predict`` (one sample at a time, batch 1)."""
    with torch.no_grad():
        hits = sum(int(predict(x[i:i + 1]).argmax()) == int(y[i]) for i in range(len(x)))
    return 100.0 * hits / len(x)


@lru_cache(maxsize=None)
def _trained_state(kind: str, seed: int) -> dict:
    torch.manual_seed(seed)
    if kind == "digits":
        model, data, epochs = DigitsCNN(), digits_data(seed), 12
    else:
        model, data, epochs = WavesNet(), waves_data(seed), 10
    return {k: v.clone() for k, v in train(model, data, epochs, seed).state_dict().items()}


def digits(seed: int = 0) -> tuple[nn.Module, tuple]:
    """The digits CNN, trained (a few seconds), with one test image as the example input."""
    model = DigitsCNN()
    model.load_state_dict(_trained_state("digits", seed))
    return model.eval(), (digits_data(seed).test_x[:1],)


def waves(seed: int = 0) -> tuple[nn.Module, tuple]:
    """The waveform classifier, trained (a few seconds), with one test signal as the example input."""
    model = WavesNet()
    model.load_state_dict(_trained_state("waves", seed))
    return model.eval(), (waves_data(seed).test_x[:1],)
