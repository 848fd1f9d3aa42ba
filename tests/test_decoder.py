"""The small-LLM path: a Llama-architecture decoder (SmolLM2's) with a static KV cache, as a prefill program and a
decode program; greedy generation from the .pte files on the host equals the fake-quantized models call by call."""

from __future__ import annotations

import pytest
import torch

from tosakit.errors import TosakitError
from tosakit.generate import compile_decoder, float_step, generate
from tosakit.zoo import field
from tosakit.zoo.decoder import Decoder, DecoderConfig, decode_inputs, prefill_inputs

# SmolLM2's architecture at a test's size: 2 layers, 64 wide, 4 query and 2 key/value heads, 256 tokens, 24 positions
TINY = DecoderConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_positions=24)
PROMPT = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
STEPS = 8


def _decoder() -> Decoder:
    torch.manual_seed(0)
    return Decoder(TINY).eval()


def test_decoder_is_the_hf_llama_with_a_cache():
    """A LlamaForCausalLM's weights load unchanged; the prompt's logits are Hugging Face's, and a decode step through
    the cache gives the logits Hugging Face computes for the prompt and that token, from scratch."""
    transformers = field.import_field("transformers")
    config = dict(field.HF_MODELS["HuggingFaceTB/SmolLM2-135M"].config, vocab_size=256, hidden_size=64,
                  intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(1)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config)).eval()
    model = _decoder()
    model.load_state_dict(hf.state_dict())
    with torch.no_grad():
        logits, *caches = model(*prefill_inputs(model, PROMPT))
        torch.testing.assert_close(logits, hf(input_ids=PROMPT.long(), use_cache=False).logits, rtol=1e-4, atol=1e-4)
        step, *_ = model(*decode_inputs(77, PROMPT.shape[1], caches))
        whole = torch.cat([PROMPT.long(), torch.tensor([[77]])], 1)
        torch.testing.assert_close(step[0, -1], hf(input_ids=whole, use_cache=False).logits[0, -1], rtol=1e-4,
                                   atol=1e-4)


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    return compile_decoder(_decoder(), PROMPT, "ethos-u85-256", tmp_path_factory.mktemp("decoder"), steps=STEPS)


@pytest.mark.slow
def test_prefill_and_decode_run_whole_on_u85(programs):
    """Each program is one Ethos-U85 delegate with every op on the NPU: the cache written by SCATTER, the rotary
    rows and the token embedding read by GATHER."""
    for compiled in (programs.prefill, programs.decode):
        edge = compiled.edge
        cpu = [f"{p.node}: {p.reason}" for p in edge.placements if p.placement == "cpu" and "quantize" not in p.target]
        assert not cpu and len(edge.delegates) == 1, cpu
        [delegate] = edge.delegates
        assert delegate.report.cpu_ops == 0 and delegate.tosa_ops["SCATTER"] == 2 * TINY.num_hidden_layers
        assert delegate.tosa_ops["GATHER"] == 3  # the token embedding, the cos and sin rows
    assert programs.cycles("decode") < programs.cycles("prefill")


@pytest.mark.slow
@pytest.mark.numerics
def test_generation_from_the_pte_files_equals_the_fake_quantized_models(programs):
    """Prefill and 8 decode steps from the .pte files (the Ethos-U85 command streams on the simulator): the same
    tokens as the fake-quantized models (both exact, so no float summation order decides a tie), every call's
    logits within one step of theirs (TOSA and PyTorch round exact ties apart) and most of them equal to the last
    bit; the cache carries the prompt (decoding from empty caches gives other logits)."""
    model = _decoder()
    want, want_logits = generate(programs.fake_quant_step(), model, PROMPT, STEPS)
    got, got_logits = generate(programs.program_step(engine="npu"), model, PROMPT, STEPS)
    assert got == want and len(got) == STEPS + 1
    steps = [programs.logits_step("prefill")] + [programs.logits_step("decode")] * STEPS
    assert all(0 < s < 1 for s in steps)
    diffs = [float((g - w).abs().max()) / s for g, w, s in zip(got_logits, want_logits, steps)]
    assert max(diffs) <= 1.0001 and sum(d == 0 for d in diffs) >= STEPS, diffs
    forgetful = programs.program_step(engine="npu")("decode", decode_inputs(got[0], PROMPT.shape[1],
                                                                            model.empty_caches()))[0]
    assert float((forgetful[0, -1] - got_logits[1]).abs().max()) > 2 * steps[1]


def test_generation_past_the_cache_is_refused():
    model = _decoder()
    with pytest.raises(TosakitError, match=r"12-token prompt and 13 steps need 25 cache positions; the decoder "
                                           r"has 24"):
        generate(float_step(model), model, PROMPT, 13)


@pytest.mark.parametrize("argv,message", [
    (["-m", "hf:HuggingFaceTB/SmolLM3"], "is not a decoder tosakit builds with a KV cache"),
    (["--layers", "31"], "--layers 31: HuggingFaceTB/SmolLM2-135M has 30 layers"),
    (["--layers", "1", "--prompt-length", "60", "--max-positions", "64"], "60-token prompt and 8 steps need 68"),
])
def test_generate_cli_refuses_bad_options_before_compiling(argv, message, tmp_path, capsys):
    from tosakit.cli import main

    assert main(["generate", "-q", "-o", str(tmp_path / "out"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not list((tmp_path / "out").glob("*.pte"))


@pytest.mark.slow
@pytest.mark.parametrize("quantize", [False, True], ids=["fp", "int"])
@pytest.mark.parametrize("which", ["prefill", "decode"])
def test_decoder_cpu_programs_run_in_executorch(program_check, which, quantize):
    """Without a delegate, the prefill and decode programs (index_put's optional tensor list, the int32 positions,
    GQA's expand), float and quantized, load and run in ExecuTorch's runtime and equal PyTorch."""
    model = _decoder()
    inputs = prefill_inputs(model, PROMPT)
    if which == "decode":
        with torch.no_grad():
            _, *caches = model(*inputs)
        inputs = decode_inputs(5, PROMPT.shape[1], caches)
    program_check.cpu_only(model, inputs, quantize=quantize)
