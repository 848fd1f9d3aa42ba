"""Recurrent networks: an LSTM keyword-spotting classifier over 16 frames of 40 MFCC-like features, and a CRNN
text-line recognizer (convolutions, a bidirectional GRU, per-column letter scores)."""

from __future__ import annotations

import torch
from torch import nn

from ._init import init_weights

FRAMES, FEATURES, HIDDEN, CLASSES = 16, 40, 64, 12


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


class Crnn(nn.Module):
    """CRNN: two conv/ReLU/max-pool blocks over a 16x32 text-line image, its columns (8 x 32 features) read by a
    bidirectional GRU (32 hidden each way), a linear layer to 20 symbols and log-softmax, as CTC decoders take."""

    def __init__(self, symbols: int = 20, hidden: int = 32):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d((2, 1)))
        self.gru = nn.GRU(32 * 4, hidden, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, symbols)

    def forward(self, x):
        columns = self.features(x).permute(0, 3, 1, 2).flatten(2)  # [B, W, C*H]
        return self.fc(self.gru(columns)[0]).log_softmax(-1)


def crnn(seed: int = 0) -> tuple[nn.Module, tuple]:
    torch.manual_seed(seed)
    model = init_weights(Crnn(), seed, torch.randn(8, 1, 16, 32), linear_std=0.1)
    return model, (torch.randn(1, 1, 16, 32),)
