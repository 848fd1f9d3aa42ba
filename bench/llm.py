"""The small-LLM benches: SmolLM2-135M's shape on Ethos-U85 at its memory limit (int8 and 4-bit weights, decode
cycles beside the DRAM's weight-streaming bound), and a small decoder of the same architecture trained on the
standard library's source, its held-out perplexity per weight scheme (float, fake-quantized, the program)."""

from __future__ import annotations

import time
from pathlib import Path


def llm(out: Path) -> None:
    """SmolLM2-135M's shape (random weights) on ethos-u85-256 as ExecuTorch's Arm backend tests it
    (Ethos_U85_SYS_DRAM_Mid, Dedicated_Sram_384KB), int8 then a8w4 (4-bit weights), with a 64-position KV cache
    updated in place (int8 state shared by the program's two methods): a 32-token prefill method and a one-token
    decode method, compiled and written; prefill and 8 decode steps run from the .pte on the host (the command
    streams simulated) against the fake-quantized models; cycles per call and per decode token beside the DRAM's
    weight-streaming bound, the memory each needs."""
    import torch

    from tosakit.generate import DECODER_SCHEMES
    from tosakit.specs import EthosUCompileSpec
    from tosakit.zoo.field import hf_decoder

    steps, model = 8, hf_decoder("hf:HuggingFaceTB/SmolLM2-135M")
    prompt = torch.randint(0, model.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(0),
                           dtype=torch.int32)
    spec = EthosUCompileSpec("ethos-u85-256", system_config="Ethos_U85_SYS_DRAM_Mid",
                             memory_mode="Dedicated_Sram_384KB")
    decode = {scheme: _llm_scheme(out, scheme, model, prompt, spec, steps) for scheme in DECODER_SCHEMES
              if scheme != "a16w8"}
    print("decode with 4-bit weights: " + ", ".join(f"{s} {decode[s] / decode['int8']:.3f}x" for s in decode
                                                    if s != "int8") + " the int8 decode's cycles")


def _llm_scheme(out: Path, scheme: str, model, prompt, spec, steps: int) -> int:
    """One scheme of the llm bench: compiled, its figures and its generation printed; its decode cycles."""
    from tosakit.generate import compile_decoder, decoder_scheme, generate
    from tosakit.runtime import Limits, load
    from tosakit.runtime.ethosu.hardware import ACCELERATORS
    from tosakit.runtime.ethosu.system import compile_flags, memory_system
    from tosakit.runtime.ethosu.timing import channel_bandwidth
    from tosakit.runtime.pools import runner_memory

    start = time.perf_counter()
    folder = out / "llm" / scheme
    folder.mkdir(parents=True, exist_ok=True)
    config, modules = decoder_scheme(scheme)
    programs = compile_decoder(model, prompt, spec, folder, steps=steps, config=config, module_configs=modules)
    seconds = time.perf_counter() - start
    print(f"SmolLM2-135M shape, {scheme}, ethos-u85-256 Dedicated_Sram_384KB: prefill {prompt.shape[1]} tokens, "
          f"decode 1 token, KV cache {model.config.max_positions} positions; both compiled in {seconds:.0f} s")
    for which in ("prefill", "decode"):
        compiled = getattr(programs, which)
        cpu = [p for p in compiled.edge.placements if p.placement == "cpu" and p.compute]
        reports = [d.report for d in compiled.edge.delegates]
        cycles = sum(r.total_cycles for r in reports)
        macs = sum(r.mac_count for r in reports) / (cycles * max(r.macs_per_cycle for r in reports))
        loaded = load(programs.paths[which])
        pools = runner_memory(loaded.program, loaded.segments, loaded.plan(programs.methods[which]))
        per = f" ({cycles / prompt.shape[1]:,.0f} per token)" if which == "prefill" else " per token"
        print(f"  {which}: {len(compiled.edge.delegates)} delegate(s), CPU compute ops {len(cpu)}; cycles "
              f"{cycles:,}{per}, {1e3 * sum(r.inference_time_s for r in reports):.2f} ms at the NPU clock; "
              f"MAC utilisation {100 * macs:.1f}%; bound by "
              + ", ".join(f"{k} {100 * v:.0f}%" for r in reports for k, v in r.bound_by.items()))
        print(f"    SRAM {max(r.sram_used_bytes for r in reports) / 1024:.0f} KiB; encoded weights "
              f"{sum(r.weights_encoded_bytes for r in reports) / 2**20:.1f} MiB; .pte "
              f"{programs.paths[which].stat().st_size / 2**20:.1f} MiB; Ethos-U scratch "
              f"{sum(d.scratch or 0 for d in pools.delegates) / 2**20:.2f} MiB; KV cache (state) "
              f"{_state_bytes(loaded.plan(programs.methods[which])) / 1024:.0f} KiB; runner method pool "
              f"{pools.runner_method_pool / 1024:.0f} KiB, temp pool {pools.temp_pool / 2**20:.2f} MiB")
    print("  " + _stored_once(programs))
    weights = sum(d.report.weights_encoded_bytes for d in programs.decode.edge.delegates)
    hw = ACCELERATORS[spec.target_name]
    dram = next(p for p in memory_system(compile_flags(spec.to_list()), hw).regions.values() if p.name == "Dram")
    bound = weights / dram.bandwidth
    channel = channel_bandwidth(hw, dram, "fast_weight")
    one_channel = weights / channel
    cycles = programs.cycles("decode")
    print(f"  decode: {cycles:,} cycles = {cycles / bound:.2f}x the DRAM weight-streaming bound ({weights / 2**20:.1f} "
          f"MiB encoded weights at {dram.bandwidth:g} B/cycle: {bound:,.0f} cycles); one weight channel's ceiling "
          f"in Vela's model ({channel:.2f} B/cycle: {channel * dram.read_latency / 0.8:,.0f} B in flight, as its "
          f"read buffers allow, over the DRAM's {dram.read_latency}-cycle latency) {one_channel:,.0f} cycles, "
          f"{one_channel / bound:.2f}x the bound")
    start = time.perf_counter()
    want, want_logits = generate(programs.fake_quant_step(), model, prompt, steps)
    reference_s = time.perf_counter() - start
    start = time.perf_counter()
    limits = Limits(max_memory=12 << 30, timeout=3600.0)
    got, got_logits = generate(programs.program_step(engine="npu", limits=limits), model, prompt, steps)
    run_s = time.perf_counter() - start
    scale = [programs.logits_step("prefill")] + [programs.logits_step("decode")] * steps
    diffs = [float((g - w).abs().max()) / s for g, w, s in zip(got_logits, want_logits, scale)]
    print(f"  generation, prefill + {steps} decode steps from the .pte files (simulated, {run_s:.0f} s) vs the "
          f"fake-quantized models ({reference_s:.0f} s): tokens {'equal' if got == want else 'DIFFER'} {got}; "
          f"logits equal in {sum(d == 0 for d in diffs)} of {len(diffs)} calls, at most {max(diffs):.0f} step(s) "
          "apart")
    return cycles


def _stored_once(programs) -> str:
    """decoder.pte's bytes (and its .ptd's) against one copy of the encoded weights plus every command stream."""
    from tosakit.backends.ethosu.payload import parse_payload
    from tosakit.runtime import load

    loaded = load(programs.paths["decode"], data=programs.data)
    payloads = {m: [parse_payload(loaded.delegate_payload(d)) for d in loaded.plan(m).delegates]
                for m in loaded.method_names}
    once = max(sum(len(p.weight_data) for p in ps) for ps in payloads.values())
    streams = sum(len(p.cmd_data) for ps in payloads.values() for p in ps)
    total = programs.paths["decode"].stat().st_size + (programs.data.stat().st_size if programs.data else 0)
    return (f"decoder.pte {total / 2**20:.1f} MiB = {total / (once + streams):.3f}x one copy of the encoded weights "
            f"({once / 2**20:.1f} MiB) plus the command streams ({streams / 2**20:.2f} MiB): the methods share "
            "the weights as named data")


def _state_bytes(plan) -> int:
    """Bytes of the state a method writes back (``aten::copy_`` destinations)."""
    from tosakit.runtime.inspect import state_values
    from tosakit.runtime.validate import tensor_nbytes

    return sum(tensor_nbytes(plan.values[i].val) for i in state_values(plan))




WINDOWS = 64  # held-out windows the perplexities are measured on
CALIBRATION_STEPS = 4  # decode calls compile_decoder calibrates on after each prompt
CALIBRATION_WINDOWS = 32  # training windows the quantization is calibrated on


def llm_quality(out: Path) -> None:
    """The text LM (``zoo.textlm``) trained, compiled for ethos-u85-256 per weight scheme (calibrated on training
    windows), and its held-out perplexity measured as the float model, the
    fake-quantized models and the program on the host (the command streams simulated), side by side."""
    from tosakit.generate import DECODER_SCHEMES, compile_decoder, decoder_scheme, float_step
    from tosakit.zoo.textlm import TEXT_LM, perplexity, stdlib_corpus, train_text_lm

    corpus = stdlib_corpus()
    start = time.perf_counter()
    model = train_text_lm(corpus)
    c = TEXT_LM
    print(f"text LM: SmolLM2's architecture, {c.num_hidden_layers} layers {c.hidden_size} wide, byte-level, "
          f"{c.max_positions}-byte windows; trained on {corpus.source} in {time.perf_counter() - start:.0f} s")
    length = c.max_positions - CALIBRATION_STEPS  # the prefill's window: the cache holds the calibration's decode too
    held = corpus.windows(WINDOWS, length + 1)
    prompt, *calibration = corpus.windows(1 + CALIBRATION_WINDOWS, length, held_out=False, seed=1)[:, None]
    reference = perplexity(float_step(model), model, held)
    print(f"  float: held-out perplexity {reference:.3f} ({WINDOWS} windows, {held.numel() - WINDOWS} bytes "
          "predicted; uniform would be 256)")
    found = {}
    for scheme in DECODER_SCHEMES:
        folder = out / "llm-quality" / scheme
        folder.mkdir(parents=True, exist_ok=True)
        config, modules = decoder_scheme(scheme)
        programs = compile_decoder(model, prompt, "ethos-u85-256", folder, steps=CALIBRATION_STEPS, config=config,
                                   calibration=list(calibration), module_configs=modules)
        fake = perplexity(programs.fake_quant_step(), model, held)
        start = time.perf_counter()
        program = perplexity(programs.program_step(engine="npu"), model, held)
        found[scheme] = (fake, program)
        print(f"  {scheme}: fake-quantized {fake:.3f} ({fake / reference:.3f}x float); the program on the host "
              f"{program:.3f} ({program / fake:.3f}x its fake-quantized models, {time.perf_counter() - start:.0f} s)")
    print(f"  int8 fake-quantized vs float {found['int8'][0] / reference:.3f}x (goal: within 1.02x); the 4-bit "
          "programs vs int8 fake-quantized: " + ", ".join(f"{s} {found[s][1] / found['int8'][0]:.3f}x" for s in found
                                                          if s.startswith("a8w4")) + " (goal: within 1.05x)")
