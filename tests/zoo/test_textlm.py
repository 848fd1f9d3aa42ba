"""The text LM that measures a weight scheme's effect on a language model's quality without downloads: trained on
the standard library's own source, its held-out perplexity as the float model, the fake-quantized models and the
program on the host (``make bench -- llm-quality`` prints the figures at its full size)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from tosakit.errors import TosakitError
from tosakit.generate import compile_decoder, float_step
from tosakit.zoo.decoder import Decoder
from tosakit.zoo.textlm import TEXT_LM, perplexity, stdlib_corpus, train_text_lm

SMALL = replace(TEXT_LM, hidden_size=32, intermediate_size=64, max_positions=16)


@pytest.fixture(scope="module")
def corpus():
    return stdlib_corpus(limit=1 << 16)


def test_corpus_is_the_standard_librarys_source_split_by_module(corpus):
    """The same bytes every time; training and held-out text from different modules; windows seeded."""
    again = stdlib_corpus(limit=1 << 16)
    assert np.array_equal(corpus.train, again.train) and np.array_equal(corpus.held_out, again.held_out)
    assert len(corpus.train) == len(corpus.held_out) == 1 << 16
    assert b"def " in corpus.train.tobytes() and not np.array_equal(corpus.train[:4096], corpus.held_out[:4096])
    windows = corpus.windows(4, 9, seed=3)
    assert windows.shape == (4, 9) and windows.dtype == torch.int32 and torch.equal(windows, corpus.windows(4, 9, seed=3))


@pytest.mark.numerics
def test_training_learns_the_text(corpus):
    """A short training run predicts held-out source far better than chance (perplexity 256) or the untrained model;
    the trained decoder keeps its cache in place, for compile_decoder."""
    held = corpus.windows(16, SMALL.max_positions + 1)
    torch.manual_seed(0)
    untrained = Decoder(SMALL, cache_in_place=True).eval()
    model = train_text_lm(corpus, steps=150, config=SMALL, lr=1e-2)
    assert model.cache_in_place and not model.training
    before, after = perplexity(float_step(untrained), untrained, held), perplexity(float_step(model), model, held)
    assert after < 64 and after < before / 3, (before, after)


@pytest.mark.slow
@pytest.mark.numerics
def test_program_perplexity_is_its_fake_quantized_models_u85(corpus, tmp_path):
    """Compiled for ethos-u85-256 with calibration prompts, the program run on the host (the command streams
    simulated) scores the held-out text as its fake-quantized models do; a calibration prompt of another length is
    refused."""
    model = train_text_lm(corpus, steps=60, config=SMALL, lr=1e-2)
    length = SMALL.max_positions - 2
    prompt, *calibration = corpus.windows(4, length, held_out=False, seed=1)[:, None]
    with pytest.raises(TosakitError, match=r"calibration prompt of shape \[1, 3\]: the prefill takes \[1, 14\]"):
        compile_decoder(model, prompt, "ethos-u85-256", tmp_path, steps=2, calibration=[prompt[:, :3]])
    programs = compile_decoder(model, prompt, "ethos-u85-256", tmp_path, steps=2, calibration=calibration)
    held = corpus.windows(8, length + 1)
    fake = perplexity(programs.fake_quant_step(), model, held)
    program = perplexity(programs.program_step(engine="npu"), model, held)
    assert abs(program / fake - 1) < 0.01, (program, fake)
