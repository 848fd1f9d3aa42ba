"""A decoder's prefill and decode programs, and greedy generation with them on the host.

``compile_decoder`` quantizes and compiles one ``zoo.decoder.Decoder`` twice — the prompt's length (prefill) and
one token (decode) — calibrated on the float model's own greedy run. A decoder whose KV cache is its own state
(``cache_in_place``) becomes one ``decoder.pte`` with methods ``prefill`` and ``decode`` sharing the cache, kept
as int8 in the program's memory; one with the cache as inputs and outputs becomes two ``.pte`` files.
``generate`` runs a step function greedily: the prompt, then one token per step, the KV caches handed from each
step's outputs to the next one's inputs. ``Generation`` compares the programs (the ``.pte`` files, run by the
host runtime) with the fake-quantized models (evaluated exactly) and the float model, step by step."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .capture import export, graph_attr, own_state, set_graph_attr, written_attrs
from .errors import TosakitError, write_atomic
from .flow import Compiled, compile, quantizer_for
from .program.emit import program_from_methods
from .program.ptd import serialize_ptd
from .program.pte import serialize_pte
from .quantize import QuantizationConfig
from .quantize.config import SCHEMES, get_symmetric_quantization_config
from .specs import ArmCompileSpec, EthosUCompileSpec, VelaExternalBlockPlacements, compile_spec_for_target
from .zoo.decoder import Decoder, decode_inputs, prefill_inputs

Step = Callable[[str, tuple], tuple]  # ("prefill" | "decode", inputs) -> (logits, *caches)

# A decoder's weight schemes: (the global scheme, {module: scheme}); "a8w4-head8" keeps the tied embedding's
# lm_head in int8, the projection that 4 bits cost a byte-level model most
DECODER_SCHEMES = {"int8": ("int8", {}), "a8w4": ("a8w4", {}), "a8w4-head8": ("a8w4", {"lm_head": "int8"}),
                   "a16w8": ("a16w8", {})}


def decoder_scheme(name: str) -> tuple[QuantizationConfig, dict[str, QuantizationConfig]]:
    """A ``DECODER_SCHEMES`` entry as ``compile_decoder``'s ``config`` and ``module_configs``."""
    scheme, modules = DECODER_SCHEMES[name]
    return SCHEMES[scheme](), {module: SCHEMES[s]() for module, s in modules.items()}


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
    """The prefill and decode programs: compiled (for their fake-quantized models and Vela's figures) and written;
    ``paths`` and ``methods`` say where each is (one file with two methods when the cache is the program's state)."""

    prefill: Compiled
    decode: Compiled
    paths: dict[str, Path]
    methods: dict[str, str]
    data: Path | None = None  # the .ptd holding the weights (external_data)

    def fake_quant_step(self) -> Step:
        """The fake-quantized models, evaluated exactly (what the programs must equal), sharing their state."""
        from .runtime import evaluate_exact

        models = {"prefill": self.prefill.quantized, "decode": self.decode.quantized}
        share_state(models["prefill"], models["decode"])
        return lambda which, inputs: evaluate_exact(models[which], *inputs)

    def program_step(self, engine: str | None = None, limits=None) -> Step:
        """The ``.pte`` files, read once each and run by the host runtime (Ethos-U delegates on ``engine``, within
        ``runtime.Limits``: a 135M-parameter decoder's simulation needs more than the default gigabyte); a
        program's state starts anew with each step function."""
        from .runtime import load

        loaded = {path: load(path, engine=engine, limits=limits, data=self.data) for path in set(self.paths.values())}
        return lambda which, inputs: tuple(loaded[self.paths[which]].run(inputs, self.methods[which]))

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


def share_state(*models: torch.nn.Module) -> None:
    """The state buffers (written in place) of the first graph become the others' too, tensor for tensor: the
    graphs of one model's methods then read and write one KV cache."""
    first = models[0]
    for name in written_attrs(first.graph):
        for other in models[1:]:
            set_graph_attr(other, name, graph_attr(first, name))


def _state_observers(gm, name: str) -> list:
    """The observers reading state ``name`` where the graph reads it."""
    return [gm.get_submodule(u.target) for n in gm.graph.nodes if n.op == "get_attr" and n.target == name
            for u in n.users if u.op == "call_module"]


def _first_inputs(calls: list[tuple[str, tuple]]) -> dict[str, tuple]:
    """Each method's first inputs, the methods in the order they first ran (prefill, decode)."""
    first: dict[str, tuple] = {}
    for which, inputs in calls:
        first.setdefault(which, inputs)
    return first


def _quantize_sharing_state(model: Decoder, calls: list[tuple[str, tuple]], spec: ArmCompileSpec,
                            config: QuantizationConfig | None,
                            module_configs: dict[str, QuantizationConfig] | None = None) -> dict[str, torch.nn.Module]:
    """The prefill and decode graphs quantized as one model: calibrated on the calls in the order they ran, with one
    KV cache between them, and each cache quantized alike in both (its observers' ranges joined), so the program
    keeps it as integers that either method reads."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = quantizer_for(spec).set_global(config or get_symmetric_quantization_config(is_per_channel=True))
    for name, module_config in (module_configs or {}).items():
        quantizer.set_module_name(name, module_config)
    first = _first_inputs(calls)
    with torch.no_grad():
        prepared = {which: prepare_pt2e(own_state(export(model, inputs).module()), quantizer)
                    for which, inputs in first.items()}
        share_state(*prepared.values())
        graphs = list(prepared.values())
        initial = {name: graph_attr(graphs[0], name).clone() for name in written_attrs(graphs[0].graph)}
        for which, inputs in calls:
            prepared[which](*inputs)
        for name, value in initial.items():
            _join([o for g in graphs for o in _state_observers(g, name)])
            graph_attr(graphs[0], name).copy_(value)  # calibration ran; the cache starts over
        for observers in _alike_observers(graphs):
            _join(observers)
        return {which: convert_pt2e(p) for which, p in prepared.items()}


def _join(observers: list) -> None:
    """Observers made to give one range, the union of theirs."""
    if observers and all(hasattr(o, "min_val") for o in observers):
        low = torch.stack([o.min_val for o in observers]).min(0).values
        high = torch.stack([o.max_val for o in observers]).max(0).values
        for o in observers:
            o.min_val.copy_(low)
            o.max_val.copy_(high)


def _alike_observers(graphs: list) -> list[list]:
    """The observers that watch the same tensor of the model in every graph (same observer, same watched node
    names, same range shape): joined, every method quantizes that tensor alike, so their Vela compilations
    encode the same weights and scales, which the program then stores once."""
    def watched(gm) -> dict[str, tuple]:
        return {n.target: (tuple(a.name for a in n.args if hasattr(a, "name")),
                           tuple(getattr(gm.get_submodule(n.target), "min_val", torch.empty(0)).shape))
                for n in gm.graph.nodes if n.op == "call_module"}

    views = [watched(g) for g in graphs]
    return [[g.get_submodule(name) for g in graphs] for name, key in views[0].items()
            if all(v.get(name) == key for v in views[1:])]


def compile_decoder(model: Decoder, prompt: torch.Tensor, spec: ArmCompileSpec | str, folder: str | Path,
                    steps: int = 8, config: QuantizationConfig | None = None,
                    external_data: bool = False, calibration: list[torch.Tensor] = (),
                    module_configs: dict[str, QuantizationConfig] | None = None) -> DecoderPrograms:
    """Quantize and compile ``model`` for a ``prompt``-long prefill and a one-token decode, calibrated on the float
    model's greedy runs (the prompt and each ``calibration`` prompt of its length; the ``steps`` decode calls after
    each; ``module_configs``: another config for the modules so named, e.g. ``lm_head``), and write them into
    ``folder``: ``decoder.pte``
    (methods prefill and decode) when the cache is the model's state, else ``prefill.pte`` and ``decode.pte``.
    In ``decoder.pte`` the methods quantize alike, so Vela encodes their weights alike: each Ethos-U delegate's
    weights are named data the methods share, in the program, or with ``external_data`` in ``decoder.ptd``."""
    spec = copy.copy(spec) if isinstance(spec, ArmCompileSpec) else compile_spec_for_target(spec)
    calls: list[tuple[str, tuple]] = []
    run = float_step(model)
    state = {name: b.clone() for name, b in model.named_buffers()}
    for text in (prompt, *calibration):
        if text.shape != prompt.shape:
            raise TosakitError(f"a calibration prompt of shape {list(text.shape)}: the prefill takes "
                               f"{list(prompt.shape)}", "give calibration prompts of the prompt's length")
        generate(lambda which, inputs: calls.append((which, inputs)) or run(which, inputs), model, text, steps)
        for name, b in model.named_buffers():  # the float run wrote the cache; the programs start from the model's
            b.copy_(state[name])
    folder = Path(folder)
    if not model.cache_in_place:
        compiled = {which: compile(model, next(i for w, i in calls if w == which), spec, quantize=True, config=config,
                                   module_configs=module_configs,
                                   calibration=[i for w, i in calls if w == which])
                    for which in ("prefill", "decode")}
        paths = {which: write_atomic(folder / f"{which}.pte", c.program.buffer) for which, c in compiled.items()}
        return DecoderPrograms(compiled["prefill"], compiled["decode"], paths, {w: "forward" for w in paths})
    quantized = _quantize_sharing_state(model, calls, spec, config, module_configs)
    if isinstance(spec, EthosUCompileSpec) and not spec.external_block_placements.blocks():
        spec.external_block_placements = VelaExternalBlockPlacements(weight_data="decoder")
    first = _first_inputs(calls)
    compiled = {}
    for which, gm in quantized.items():
        c = compile(export(gm, first[which]), first[which], spec)
        compiled[which] = Compiled(spec, gm, c.edge, c.program)
    emitted = program_from_methods({which: (c.edge.program.graph_module, c.edge.program.in_spec,
                                            c.edge.program.out_spec) for which, c in compiled.items()},
                                   blocks_in_program=not external_data)
    data = None
    for tag, entries in emitted.external.items():  # the tags the spec placed blocks under: decoder.ptd
        data = write_atomic(folder / f"{tag}.ptd", serialize_ptd(entries))
    path = write_atomic(folder / "decoder.pte", serialize_pte(emitted.program, emitted.segments))
    return DecoderPrograms(compiled["prefill"], compiled["decode"], {w: path for w in compiled},
                           {w: w for w in compiled}, data)
