"""The small-LLM path: a Llama-architecture decoder (SmolLM2's) with a static KV cache, as a prefill program and a
decode program; greedy generation from the .pte files on the host equals the fake-quantized models call by call."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from tosakit.errors import TosakitError
from tosakit.generate import compile_decoder, float_step, generate
from tosakit.runtime import load
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


@pytest.fixture(scope="session")  # kept while the worker runs other modules' tests
def programs(tmp_path_factory):
    return compile_decoder(_decoder(), PROMPT, "ethos-u85-256", tmp_path_factory.mktemp("decoder"), steps=STEPS)


@pytest.mark.slow
def test_prefill_and_decode_run_whole_on_u85(programs):
    """Each program is one Ethos-U85 delegate with every op on the NPU: the cache written by SCATTER, the rotary
    rows and the token embedding read by GATHER."""
    for compiled in (programs.prefill, programs.decode):
        edge = compiled.edge
        cpu = [f"{p.node}: {p.reason}" for p in edge.placements if p.placement == "cpu" and p.compute]
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


# The decoder's functions that need int16 TABLEs (not lowered yet): with a16w8 only these may stay on the CPU.
INT16_TABLE_CURVES = {"aten.exp.default", "aten.reciprocal.default", "aten.rsqrt.default", "aten.silu.default"}


@pytest.mark.numerics
def test_a16w8_prefill_runs_whole_on_the_npu_u85():
    """a16w8 on ethos-u85-256: every op on the NPU in int16 — the embedding's GATHER, RMSNorm's square, the rotary
    negation, the attention MatMuls (int16 x int16 -> int48), the softmax's max and sum, the mask's SELECT, and exp,
    SiLU, rsqrt and reciprocal as int16 TABLEs. Every delegated layer is within one step of the exact
    fake-quantized layer but the TABLEs, whose 128-input segments a straight line cannot follow where the
    function bends or nears a pole over the range calibrated here (rsqrt 12-33 steps, reciprocal up to 685 of
    32767, SiLU 17; the format's limits pinned in tests/lower/test_int16_tables.py)."""
    from tosakit.flow import compile
    from tosakit.quantize import get_symmetric_a16w8_quantization_config
    from tosakit.verify.layers import layer_reports

    model = _decoder()
    inputs = prefill_inputs(model, PROMPT)
    compiled = compile(model, inputs, "ethos-u85-256", quantize=True, config=get_symmetric_a16w8_quantization_config())
    cpu = [p.node for p in compiled.edge.placements if p.placement == "cpu" and p.compute]
    assert not cpu and len(compiled.edge.delegates) == 1, cpu
    ops = set(compiled.edge.delegates[0].tosa_ops)
    assert {"GATHER", "NEGATE", "MATMUL", "REDUCE_MAX", "REDUCE_SUM", "SELECT", "TABLE"} <= ops
    layers = layer_reports(compiled.edge, inputs, None)
    assert sum(layer.matches for layer in layers) > 100
    assert {layer.target for layer in layers if not layer.matches} <= INT16_TABLE_CURVES, \
        [(layer.node, layer.steps_off) for layer in layers if not layer.matches]


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


def test_generate_cli_names_the_schemes_it_takes(capsys):
    """generate --scheme: a scheme a decoder does not take is refused, naming the ones it does."""
    from tosakit.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["generate", "-q", "--scheme", "int4"])
    assert exit_.value.code == 2
    assert "--scheme: invalid choice: 'int4' (choose from 'int8', 'a8w4', 'a8w4-head8', 'a16w8')" in \
        capsys.readouterr().err


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


# ------------------------------------------------------------------ the KV cache as the program's state


def _in_place() -> Decoder:
    torch.manual_seed(0)
    return Decoder(TINY, cache_in_place=True).eval()


def test_in_place_cache_gives_the_same_logits_as_the_cache_passed_in():
    """The attentions' own caches, written in place, give the logits of the caches handed from call to call."""
    io, own = _decoder(), _in_place()
    assert not set(own.state_dict()) ^ set(io.state_dict())  # the caches are not weights: HF state dicts load
    _, want = generate(float_step(io), io, PROMPT, STEPS)
    _, got = generate(float_step(own), own, PROMPT, STEPS)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="session")  # kept while the worker runs other modules' tests
def in_place(tmp_path_factory):
    return compile_decoder(_in_place(), PROMPT, "ethos-u85-256", tmp_path_factory.mktemp("in_place"), steps=STEPS)


@pytest.mark.slow
def test_in_place_cache_is_one_program_with_two_methods_u85(in_place):
    """One decoder.pte, methods prefill and decode, each one Ethos-U85 delegate with every op on the NPU; the four
    caches are int8 state in arena 2, which both methods read and write (no quantize on the CPU: the only kernels
    are the logits' dequantize and the caches' write-back); Vela's figures equal the cache-as-I/O programs'."""
    from tosakit.runtime.inspect import describe

    assert in_place.paths["prefill"] == in_place.paths["decode"] and in_place.paths["decode"].name == "decoder.pte"
    loaded = load(in_place.paths["decode"])
    assert loaded.method_names == ["prefill", "decode"]
    for which in ("prefill", "decode"):
        compiled = getattr(in_place, which)
        cpu = [p.node for p in compiled.edge.placements if p.placement == "cpu" and p.compute]
        assert not cpu and len(compiled.edge.delegates) == 1, cpu
        assert compiled.edge.delegates[0].tosa_ops["SCATTER"] == 2 * TINY.num_hidden_layers
        caches = [n for n in compiled.edge.program.graph.nodes if n.op == "placeholder" and "state" in n.meta]
        assert len(caches) == 4 and all(n.meta["val"].dtype == torch.int8 for n in caches)
        plan = loaded.plan(which)
        assert {o.name for o in plan.operators} == {"quantized_decomposed::dequantize_per_tensor", "aten::copy_"}
    text = describe(loaded)
    cache = 2 * TINY.num_hidden_layers * 1 * TINY.num_key_value_heads * TINY.max_positions * TINY.head_dim
    assert text.count(f"state: 4 buffer(s), {cache / 1024:.1f} KiB, kept from call to call in arena(s) 2 (arena 2: "
                      "shared with the program's other methods)") == 2


@pytest.mark.slow
@pytest.mark.numerics
def test_in_place_generation_equals_the_fake_quantized_models(in_place):
    """Prefill and 8 decode steps from decoder.pte (the command streams simulated, the cache kept by the program
    between calls and methods): the fake-quantized models' tokens, every call's logits within one step of theirs
    (TOSA and PyTorch round exact ties apart), most equal to the last bit; a program loaded anew starts from an
    empty cache again."""
    model = _in_place()
    want, want_logits = generate(in_place.fake_quant_step(), model, PROMPT, STEPS)
    got, got_logits = generate(in_place.program_step(engine="npu"), model, PROMPT, STEPS)
    assert got == want and len(got) == STEPS + 1
    steps = [in_place.logits_step("prefill")] + [in_place.logits_step("decode")] * STEPS
    diffs = [float((g - w).abs().max()) / s for g, w, s in zip(got_logits, want_logits, steps)]
    assert max(diffs) <= 1.0001 and sum(d == 0 for d in diffs) > len(diffs) // 2, diffs
    fresh = in_place.program_step(engine="npu")
    alone = fresh("decode", decode_inputs(got[0], PROMPT.shape[1], []))[0]
    assert float((alone[0, -1] - got_logits[1]).abs().max()) > 2 * steps[1]  # the cache carried the prompt


@pytest.mark.slow
def test_the_methods_store_their_weights_once_u85(in_place, tmp_path):
    """The methods quantize alike, and here Vela picks the same block depths for both, so it encodes their weights
    alike: both Ethos-U delegates name one weight block (named data, ExecuTorch's external-block layout), stored
    once in decoder.pte, at most 1.1x one copy of the weights plus both command streams. (SmolLM2's shape does not
    share yet: Vela picks other OFM block depths for a 32-token prefill than for one token, and its weight
    encoding follows them; `make bench -- llm` prints the ratio.) With external_data the block lives in
    decoder.ptd, and the two files give the same tokens."""
    from tosakit.backends.ethosu.payload import parse_payload
    from tosakit.program.pte import deserialize_pte

    path = in_place.paths["decode"]
    program, segments = deserialize_pte(path.read_bytes())
    [named] = program.named_data
    loaded = load(path)
    payloads = [parse_payload(loaded.delegate_payload(loaded.plan(m).delegates[0])) for m in ("prefill", "decode")]
    assert payloads[0].weight_data == payloads[1].weight_data == segments[named.segment_index]
    once = len(payloads[0].weight_data) + sum(len(p.cmd_data) for p in payloads)
    assert path.stat().st_size <= 1.1 * once, (path.stat().st_size, once)
    from tosakit.runtime.pools import runner_memory

    assert runner_memory(program, segments, program.execution_plan[1]).delegates[0].scratch  # reads named data
    from tosakit.program.emit import program_from_methods
    from tosakit.program.ptd import serialize_ptd
    from tosakit.program.pte import serialize_pte

    emitted = program_from_methods({m: (c.edge.program.graph_module, c.edge.program.in_spec, c.edge.program.out_spec)
                                    for m, c in (("prefill", in_place.prefill), ("decode", in_place.decode))})
    assert not emitted.program.named_data and list(emitted.external) == ["decoder"]  # compile_decoder(external_data)
    (tmp_path / "decoder.ptd").write_bytes(serialize_ptd(emitted.external["decoder"]))
    (tmp_path / "decoder.pte").write_bytes(serialize_pte(emitted.program, emitted.segments))
    external = replace(in_place, paths={w: tmp_path / "decoder.pte" for w in in_place.paths},
                       data=tmp_path / "decoder.ptd")
    model = _in_place()
    assert generate(external.program_step(engine="npu"), model, PROMPT, 2)[0] == \
        generate(in_place.program_step(engine="npu"), model, PROMPT, 2)[0]


@pytest.mark.slow
def test_in_place_decoder_cpu_program_runs_in_executorch(program_check, tmp_path):
    """Without a delegate, the two-method program runs in ExecuTorch's runtime, which shares the methods' state
    (arena 2): prefill then two decode steps equal PyTorch's, in ExecuTorch and in `tosakit run`."""
    from tosakit.capture import export
    from tosakit.flow import compile
    from tosakit.program.emit import program_from_methods
    from tosakit.program.pte import serialize_pte

    model, reference = _in_place(), _in_place()
    calls = [("prefill", prefill_inputs(model, PROMPT)), ("decode", decode_inputs(7, 12, [])),
             ("decode", decode_inputs(9, 13, []))]
    compiled = {which: compile(export(model, inputs), inputs, "TOSA-1.0+FP", delegate=False)
                for which, inputs in calls[:2]}
    emitted = program_from_methods({w: (c.edge.program.graph_module, c.edge.program.in_spec, c.edge.program.out_spec)
                                    for w, c in compiled.items()})
    path = tmp_path / "decoder.pte"
    path.write_bytes(serialize_pte(emitted.program, emitted.segments))
    et = program_check.oracle.run_calls(path, calls)
    loaded = load(path)
    for (which, inputs), outs in zip(calls, et):
        with torch.no_grad():
            want = reference(*inputs)[0]
        host = loaded.run(list(inputs), which)[0]
        program_check.assert_matches(torch.from_numpy(outs[0]), want, None, f"{which}: ExecuTorch vs PyTorch")
        program_check.assert_matches(host, want, None, f"{which}: tosakit run vs PyTorch")


@pytest.mark.slow
@pytest.mark.numerics
def test_a8w4_decoder_streams_half_the_bytes_and_generates_as_its_fake_quantized_models_u85(in_place, tmp_path):
    """4-bit weights (``generate --scheme a8w4``, the in-place decoder): every projection and MLP weight lowers as
    TOSA INT4, the decode call's encoded weights are at most 0.6x int8's (what a decode streaming its weights from
    DRAM waits on: `make bench -- llm` prints its cycles), and prefill + 8 decode steps from decoder.pte give the
    fake-quantized a8w4 models' tokens."""
    from tosakit.cli import DECODER_SCHEMES
    from tosakit.generate import DECODER_SCHEMES as SCHEMES, decoder_scheme

    assert list(DECODER_SCHEMES) == list(SCHEMES)
    model = _in_place()
    config, modules = decoder_scheme("a8w4")
    a8w4 = compile_decoder(model, PROMPT, "ethos-u85-256", tmp_path, steps=STEPS, config=config, module_configs=modules)
    [delegate] = a8w4.decode.edge.delegates
    [int8] = in_place.decode.edge.delegates
    assert delegate.report.weights_encoded_bytes <= 0.6 * int8.report.weights_encoded_bytes
    [module] = [m for m in a8w4.decode.edge.program.graph_module.children() if hasattr(m, "tosa")]
    int4 = [t for t in _tosa_constants(module.tosa) if t[1] == "INT4"]
    assert len(int4) >= 7 * TINY.num_hidden_layers, int4  # q, k, v, o, gate, up, down per layer
    want, _ = generate(a8w4.fake_quant_step(), model, PROMPT, STEPS)
    got, _ = generate(a8w4.program_step(engine="npu"), model, PROMPT, STEPS)
    assert got == want and len(got) == STEPS + 1


def _tosa_constants(tosa: bytes) -> list[tuple[list[int], str]]:
    """The main block's constant tensors: (shape, TOSA type name)."""
    from tosa.DType import DType
    from tosa.TosaGraph import TosaGraph

    names = {v: k for k, v in vars(DType).items() if not k.startswith("_")}
    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    tensors = [block.Tensors(i) for i in range(block.TensorsLength())]
    return [(list(t.ShapeAsNumpy()) if t.ShapeLength() else [], names[t.Type()]) for t in tensors if t.DataLength()]


@pytest.mark.slow
def test_a8w4_head8_keeps_the_lm_head_in_int8_u85(tmp_path):
    """``--scheme a8w4-head8``: the projections' and MLP's weights INT4, the lm_head's (the tied embedding, vocab x
    hidden) INT8, through ``compile_decoder``'s ``module_configs``."""
    from tosakit.generate import decoder_scheme

    config, modules = decoder_scheme("a8w4-head8")
    assert set(modules) == {"lm_head"}
    programs = compile_decoder(_in_place(), PROMPT, "ethos-u85-256", tmp_path, steps=STEPS, config=config,
                               module_configs=modules)
    [module] = [m for m in programs.decode.edge.program.graph_module.children() if hasattr(m, "tosa")]
    types = _tosa_constants(module.tosa)
    assert [t for s, t in types if s == [TINY.vocab_size, 1, 1, TINY.hidden_size]] == ["INT8"], types
    assert sum(t == "INT4" for _, t in types) >= 7 * TINY.num_hidden_layers
