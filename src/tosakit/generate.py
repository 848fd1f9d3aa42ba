"""A decoder's prefill and decode programs, and greedy generation with them on the host.

``compile_decoder`` quantizes and compiles one ``zoo.decoder.Decoder`` twice — the prompt's length (prefill) and
one token (decode) — calibrated on the float model's own greedy run, and writes the two ``.pte`` files.
``generate`` runs a step function greedily: the prompt, then one token per step, the KV caches handed from each
step's outputs to the next one's inputs. ``Generation`` compares the programs (the ``.pte`` files, run by the
host runtime) with the fake-quantized models (evaluated exactly) and the float model, step by step."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .errors import TosakitError, write_atomic
from .flow import Compiled, compile
from .quantize import QuantizationConfig
from .specs import ArmCompileSpec
from .zoo.decoder import Decoder, decode_inputs, prefill_inputs

Step = Callable[[str, tuple], tuple]  # ("prefill" | "decode", inputs) -> (logits, *caches)


def generate(step: Step, model: Decoder, prompt: torch.Tensor, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens after ``prompt`` [1, T]: prefill's, then one per decode call (``steps`` calls); and the last
    position's logits of each call. Every call runs through ``step``."""
    length = prompt.shape[1]
    if length + steps > model.config.max_positions:
        raise TosakitError(f"a {length}-token prompt and {steps} steps need {length + steps} cache positions; the "
                           f"decoder has {model.config.max_positions}",
                           "build the decoder with a larger max_positions, or generate fewer tokens")
    logits, *caches = step("prefill", prefill_inputs(model, prompt))
    last = [logits[0, -1]]
    tokens = [int(torch.argmax(last[-1]))]
    for k in range(steps):
        logits, *caches = step("decode", decode_inputs(tokens[-1], length + k, caches))
        last.append(logits[0, -1])
        tokens.append(int(torch.argmax(last[-1])))
    return tokens, last


def float_step(model: Decoder) -> Step:
    """The float model, for both calls."""
    def step(_: str, inputs: tuple) -> tuple:
        with torch.no_grad():
            return tuple(model(*inputs))
    return step


@dataclass
class DecoderPrograms:
    """The prefill and decode programs: compiled (for their fake-quantized models and Vela's figures) and written."""

    prefill: Compiled
    decode: Compiled
    paths: dict[str, Path]

    def fake_quant_step(self) -> Step:
        """The fake-quantized models, evaluated exactly (what the programs must equal)."""
        from .runtime import evaluate_exact

        models = {"prefill": self.prefill.quantized, "decode": self.decode.quantized}
        return lambda which, inputs: evaluate_exact(models[which], *inputs)

    def program_step(self, engine: str | None = None, limits=None) -> Step:
        """The ``.pte`` files, read and run by the host runtime (Ethos-U delegates on ``engine``, within
        ``runtime.Limits``: a 135M-parameter decoder's simulation needs more than the default gigabyte)."""
        from .runtime import load

        loaded = {which: load(path, engine=engine, limits=limits) for which, path in self.paths.items()}
        return lambda which, inputs: tuple(loaded[which].run(inputs))

    def logits_step(self, which: str) -> float:
        """The quantization step of ``which``'s logits output (the programs and the fake-quantized models round
        differently at exact ties: their logits may differ by this much)."""
        from .quantize.qdq import is_dequantize, qparams_of

        gm = (self.prefill if which == "prefill" else self.decode).edge.program.graph_module
        logits = next(n for n in gm.graph.nodes if n.op == "output").args[0][0]
        return qparams_of(logits, gm).s if is_dequantize(logits) else 0.0

    def cycles(self, which: str) -> int:
        """Vela's cycle estimate for one call of ``which``, all delegates."""
        compiled = self.prefill if which == "prefill" else self.decode
        return sum(d.report.total_cycles for d in compiled.edge.delegates if d.report is not None)


def compile_decoder(model: Decoder, prompt: torch.Tensor, spec: ArmCompileSpec, folder: str | Path, steps: int = 8,
                    config: QuantizationConfig | None = None) -> DecoderPrograms:
    """Quantize and compile ``model`` for a ``prompt``-long prefill and a one-token decode, each calibrated on the
    float model's greedy run (the prompt; the ``steps`` decode calls), and write ``prefill.pte`` and
    ``decode.pte`` into ``folder``."""
    calls: dict[str, list[tuple]] = {"prefill": [], "decode": []}
    run = float_step(model)
    generate(lambda which, inputs: calls[which].append(inputs) or run(which, inputs), model, prompt, steps)
    compiled = {which: compile(model, ins[0], spec, quantize=True, config=config, calibration=ins)
                for which, ins in calls.items()}
    folder = Path(folder)
    paths = {which: write_atomic(folder / f"{which}.pte", c.program.buffer) for which, c in compiled.items()}
    return DecoderPrograms(compiled["prefill"], compiled["decode"], paths)
