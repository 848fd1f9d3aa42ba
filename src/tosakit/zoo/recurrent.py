"""An LSTM keyword-spotting classifier over 49 frames of 40 MFCC-like features."""

from __future__ import annotations

import torch
from torch import nn

from ._init import init_weights

FRAMES, FEATURES, HIDDEN, CLASSES = 49, 40, 64, 12


class LSTMClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(FEATURES, HIDDEN, batch_first=True)
        self.fc = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def build(seed: int = 0) -> tuple[nn.Module, tuple]:
    torch.manual_seed(seed)
    model = init_weights(LSTMClassifier(), seed, linear_std=0.1)
    return model, (torch.randn(1, FRAMES, FEATURES),)
