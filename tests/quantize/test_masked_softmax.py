"""A masked softmax (a decoder's attention over a cache whose empty slots it leaves out) keeps its precision when
quantized: the max it subtracts is the kept scores' own, so left-out scores above every kept one (a query against
empty cache slots, whose keys are zeros) neither starve the kept exps nor stretch the exp's range."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tosakit.flow import compile
from tosakit.runtime import LoadedProgram, evaluate_exact


class CacheSoftmax(nn.Module):
    """Scores over 8 cache slots, each query keeping the slots up to its position (a mask built from an input,
    as the decoder builds it: a SELECT); or a constant causal mask (a MUL by the kept slots)."""

    def __init__(self, constant: bool):
        super().__init__()
        self.constant = constant

    def forward(self, scores, positions):
        if self.constant:
            keep = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
        else:
            keep = torch.arange(scores.shape[-1], dtype=torch.int32)[None, :] <= positions[:, None]
        return scores.masked_fill(~keep, float("-inf")).softmax(-1)


def _inputs(seed: int) -> tuple:
    """Kept scores well below the left-out ones (up to 12 apart), as against empty cache slots."""
    g = torch.Generator().manual_seed(seed)
    scores = -8 + 4 * torch.rand(1, 2, 8, 8, generator=g)
    keep = torch.arange(8)[None, :] <= torch.arange(8)[:, None]
    return torch.where(keep, scores, 4 * torch.rand(1, 2, 8, 8, generator=g)), torch.arange(8, dtype=torch.int32)


@pytest.mark.numerics
@pytest.mark.parametrize("constant", [False, True], ids=["select", "causal"])
def test_masked_softmax_keeps_its_precision_int(constant):
    """int8: every attention weight within 3 steps of float (each row's weights sum to 1 over the kept slots);
    before, a left-out score above the kept ones left their exps a few steps of a range set by the left-out."""
    model = CacheSoftmax(constant).eval()
    calibration = [_inputs(seed) for seed in range(8)]
    compiled = compile(model, calibration[0], "ethos-u85-256", quantize=True, calibration=calibration)
    x = _inputs(100)
    with torch.no_grad():
        want = model(*x)
    got = evaluate_exact(compiled.quantized, *x)[0]
    assert float((got - want).abs().max()) <= 3 / 255, float((got - want).abs().max())


@pytest.mark.numerics
def test_masked_softmax_program_is_its_fake_quantized_model_u85():
    """The program on the host (the stream simulated) gives the fake-quantized model's weights, all on the NPU."""
    model = CacheSoftmax(False).eval()
    calibration = [_inputs(seed) for seed in range(8)]
    compiled = compile(model, calibration[0], "ethos-u85-256", quantize=True, calibration=calibration)
    assert not [p for p in compiled.edge.placements if p.placement == "cpu" and p.compute]
    x = _inputs(100)
    got = LoadedProgram(compiled.program.buffer, "masked softmax", engine="npu").run(list(x))[0]
    want = evaluate_exact(compiled.quantized, *x)[0]
    assert float((got - want).abs().max()) <= 1 / 255 + 1e-6
