"""Models trained in a fraction of a second on data that needs no download, to measure quantization
accuracy, with the same weights, bit for bit, on every machine.

- ``digits``: a small CNN on the 8x8 handwritten digits scikit-learn ships (1,797 images).
- ``waves``: a 1-D conv net classifying synthetic signals (sine, square, sawtooth, chirp, noise
  bursts) generated deterministically.

How they are the same everywhere: gradient descent through a deep network is chaotic, and the order in
which a machine sums floats (its thread count, its vector ISA) changes the weights it ends with, and so
every accuracy figure. Here the convolutions are seeded random features with weights on a 1/64 grid;
on inputs on a 1/16 grid their float64 results are exact, so every machine computes the same features.
The classifier on top is fitted in closed form (ridge regression on one-hot labels, a strongly convex
problem with one solution) in float64 and rounded to a 2^-12 grid, which absorbs the last-bit
differences of the solve.
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
    """Synthetic 1-D signals [N, 1, length]: five waveform kinds, random frequency, phase, noise; sampled
    to a 1/16 grid (a 4-fractional-bit converter), so that the features are exact."""
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
            xs.append(np.round((x + rng.normal(0, 1.0, length)) * 16) / 16)
            ys.append(label)
    return _split(np.stack(xs)[:, None], np.array(ys), seed)


class DigitsCNN(nn.Module):
    """conv 3x3 (16) -> ReLU -> max pool 2 -> conv 3x3 (32) -> ReLU -> linear (512 -> 10)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Flatten(),
        )
        self.classifier = nn.Linear(512, 10)

    def forward(self, x):
        return self.classifier(self.features(x))


class WavesNet(nn.Module):
    """conv 7 (32) -> ReLU -> max pool 2 -> conv 5 (64) -> ReLU -> global average and max -> linear (128 -> 5)."""

    def __init__(self, length: int = 128):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, 32, 7, padding=3), nn.ReLU(), nn.MaxPool1d(2),
            nn.Conv1d(32, 64, 5, padding=2), nn.ReLU(),
        )
        self.mean, self.max = nn.AvgPool1d(length // 2), nn.MaxPool1d(length // 2)
        self.classifier = nn.Linear(128, len(WAVE_KINDS))

    def forward(self, x):
        h = self.features(x)
        return self.classifier(torch.cat([self.mean(h), self.max(h)], 1).flatten(1))


FEATURE_GRID = 1 / 64  # convolution weights: exact products and sums on inputs on a 1/16 grid
HEAD_GRID = 2.0 ** -12  # classifier weights: coarse enough to absorb the solve's last-bit differences
RIDGE = 1e-3  # L2 penalty per sample


def _features(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """What the classifier sees, in float64."""
    model = model.double()
    try:
        with torch.no_grad():
            if isinstance(model, WavesNet):
                h = model.features(x.double())
                return torch.cat([model.mean(h), model.max(h)], 1).flatten(1)
            return model.features(x.double())
    finally:
        model.float()


def train(model: nn.Module, data: Split, seed: int = 0) -> nn.Module:
    """Seeded grid-valued convolutions (He-scaled normals from numpy's PCG64), then the classifier fitted by
    ridge regression in float64 and rounded to HEAD_GRID: the same weights on every machine."""
    rng = np.random.default_rng(seed)
    for conv in (m for m in model.modules() if isinstance(m, (nn.Conv1d, nn.Conv2d))):
        fan_in = conv.weight[0].numel()
        w = rng.standard_normal(tuple(conv.weight.shape)) * (2.0 / fan_in) ** 0.5
        conv.weight.data = torch.from_numpy(np.round(w / FEATURE_GRID) * FEATURE_GRID).float()
        conv.bias.data.zero_()
    features = _features(model, data.train_x)
    design = torch.cat([features, torch.ones(len(features), 1, dtype=torch.float64)], 1)
    targets = nn.functional.one_hot(data.train_y, model.classifier.out_features).double()
    gram = design.T @ design + RIDGE * len(design) * torch.eye(design.shape[1], dtype=torch.float64)
    solution = torch.linalg.solve(gram, design.T @ targets)
    solution = torch.round(solution / HEAD_GRID) * HEAD_GRID
    model.classifier.weight.data = solution[:-1].T.contiguous().float()
    model.classifier.bias.data = solution[-1].float()
    return model.eval()


def accuracy(predict, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy in percent of ``predict`` (one sample at a time, batch 1)."""
    with torch.no_grad():
        hits = sum(int(predict(x[i:i + 1]).argmax()) == int(y[i]) for i in range(len(x)))
    return 100.0 * hits / len(x)


def float_accuracy(model: nn.Module, data: Split) -> float:
    """The float model's top-1 accuracy (percent) on the held-out split, computed in float64 so that no
    logit tie depends on float summation order."""
    model = model.double()
    try:
        return accuracy(lambda x: model(x.double()), data.test_x, data.test_y)
    finally:
        model.float()


@lru_cache(maxsize=None)
def _trained_state(kind: str, seed: int) -> dict:
    model, data = (DigitsCNN(), digits_data(seed)) if kind == "digits" else (WavesNet(), waves_data(seed))
    return {k: v.clone() for k, v in train(model, data, seed).state_dict().items()}


def digits(seed: int = 0) -> tuple[nn.Module, tuple]:
    """The digits CNN, trained (a tenth of a second), with one test image as the example input."""
    model = DigitsCNN()
    model.load_state_dict(_trained_state("digits", seed))
    return model.eval(), (digits_data(seed).test_x[:1],)


def waves(seed: int = 0) -> tuple[nn.Module, tuple]:
    """The waveform classifier, trained (a second), with one test signal as the example input."""
    model = WavesNet()
    model.load_state_dict(_trained_state("waves", seed))
    return model.eval(), (waves_data(seed).test_x[:1],)
