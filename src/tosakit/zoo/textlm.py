"""A small decoder LM trained on text every machine has: the bytes of the Python standard library's own source. It
has the SmolLM2 architecture at a few layers (``decoder.Decoder``), byte-level (256 tokens), and is trained with a
seeded sampler in about a minute on two cores, so a weight scheme's effect on a real language model's quality (held-
out perplexity: float, fake-quantized, the program run on the host) is measured without any download. The corpus
is this Python's standard library: its figures differ with the Python version, never from run to run."""

from __future__ import annotations

import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from .decoder import Decoder, DecoderConfig, prefill_inputs

# Two layers, 128 wide: SmolLM2's ops at a size that trains in a minute; 32 positions, the prefill's window
TEXT_LM = DecoderConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_positions=32)
HELD_OUT_EVERY = 8  # every 8th standard-library module (sorted by name) is held out


@dataclass(frozen=True)
class Corpus:
    """Training and held-out bytes (disjoint modules) and where they come from."""

    train: np.ndarray
    held_out: np.ndarray
    source: str

    def windows(self, count: int, length: int, held_out: bool = True, seed: int = 0) -> torch.Tensor:
        """``count`` seeded windows of ``length`` bytes, [count, length] int32."""
        data = self.held_out if held_out else self.train
        starts = np.random.default_rng(seed).integers(0, len(data) - length, count)
        return torch.from_numpy(np.stack([data[s:s + length] for s in starts]).astype(np.int32))


def stdlib_corpus(limit: int = 1 << 20) -> Corpus:
    """The standard library's top-level modules' source bytes, at most ``limit`` of each split."""
    folder = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in folder.glob("*.py") if p.is_file())
    if len(files) < 2 * HELD_OUT_EVERY:
        raise FileNotFoundError(f"{folder} holds {len(files)} modules: no standard library source to train on")
    held = [f for k, f in enumerate(files) if k % HELD_OUT_EVERY == HELD_OUT_EVERY - 1]
    train = [f for f in files if f not in held]

    def joined(paths) -> np.ndarray:
        return np.frombuffer(b"\n".join(p.read_bytes() for p in paths)[:limit], np.uint8)
    return Corpus(joined(train), joined(held), f"{folder} ({len(train)} modules to train on, {len(held)} held out)")


def train_text_lm(corpus: Corpus, steps: int = 1500, seed: int = 0, config: DecoderConfig = TEXT_LM,
                  lr: float = 3e-3) -> Decoder:
    """The decoder trained for ``steps`` next-byte predictions over seeded training windows (AdamW, cosine
    decay), its KV cache the model's own (``cache_in_place``), in eval mode."""
    torch.manual_seed(seed)
    model = Decoder(config)
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimiser, steps)
    windows = corpus.windows(steps, config.max_positions + 1, held_out=False, seed=seed)
    positions = torch.arange(config.max_positions, dtype=torch.int32)
    model.train()
    for window in windows:
        logits = model(window[None, :-1], positions, *model.empty_caches())[0]
        loss = F.cross_entropy(logits[0], window[1:].long())
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        schedule.step()
    trained = Decoder(config, cache_in_place=True)
    trained.load_state_dict(model.state_dict())
    return trained.eval()


def perplexity(step, model: Decoder, windows: torch.Tensor) -> float:
    """Held-out perplexity: exp of the mean next-byte negative log-likelihood over ``windows`` ([N, T + 1]), each
    window's first T bytes run as one prefill call of ``step`` (``generate``'s step functions: float, fake-quantized,
    a program)."""
    total, count = 0.0, 0
    for window in windows:
        logits = step("prefill", prefill_inputs(model, window[None, :-1]))[0]
        total += float(F.cross_entropy(logits[0].float(), window[1:].long(), reduction="sum"))
        count += window.numel() - 1
    return math.exp(total / count)
