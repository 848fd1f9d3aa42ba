"""The weight-scheme sweep (``tosakit sweep``): for a model and an Ethos-U target, each scheme — a quantization
(int8, a16w8, a8w4) with weight transforms after a '+' (2:4 pruning, clustering to N levels), on the layers named
after an '@' (every layer by default, the rest plain int8) — compiled, measured
by Vela and run on the host. Per scheme: accuracy where the model has held-out data (float, fake-quantized, the
program), else the program's SNR against float on seeded inputs; encoded weight bytes, off-chip bytes, cycles,
MAC utilisation; and each NPU operation's cycles and what bounds them. The schemes compile in a process pool;
``pareto`` marks the schemes no other beats on both accuracy and a cost."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass

import torch

from .accuracy import SchemeAccuracy, measure_scheme
from .errors import TosakitError
from .partition import cpu_compute
from .quantize.config import SCHEMES
from .quantize.transforms import LAYERS, cluster_weights, prune_2_4
from .specs import EthosUCompileSpec, compile_spec_for_target

# transform name -> (model, selected layers or None for all) -> model
TRANSFORMS = {"2:4": lambda m, modules: prune_2_4(m, modules),
              **{f"cluster{n}": (lambda n: lambda m, modules: cluster_weights(m, n, modules=modules))(n)
                 for n in (4, 8, 16, 32)}}
# layer kind -> whether a scheme ending '@kind' acts on the layer (a conv or linear module); the others stay int8
SELECTIONS = {
    # 1x1 convolutions and linear layers: nearly all of a MobileNet's weights, while its first and depthwise
    # convolutions, few weights each, are where low-bit weights cost the most accuracy
    "pointwise": lambda m: isinstance(m, torch.nn.Linear) or (m.groups == 1 and set(m.kernel_size) == {1}),
}
DEFAULT_SCHEMES = ("int8", "a16w8", "a8w4", "a8w4@pointwise", "int8+2:4", "int8+cluster16", "int8+cluster8",
                   "a8w4+2:4")
EVALUATION_SAMPLES = 4  # seeded inputs a model without held-out data is compared with float on


@dataclass(frozen=True)
class OpFigures:
    """One NPU operation as Vela estimates it."""

    name: str
    operator: str
    cycles: int
    bound_by: str


@dataclass
class SweepRow:
    """One scheme's figures."""

    scheme: str
    accuracy: SchemeAccuracy | None  # None: the model has no held-out data
    output_snr_db: float  # the program's outputs against float
    cycles: int
    weights_encoded_bytes: int
    offchip_bytes: int
    mac_utilisation: float
    cpu_ops: int
    seconds: float
    per_op: tuple[OpFigures, ...]
    sparse_ops: int = 0  # NPU operations whose weights Vela stores in its 2:4 sparse format (Ethos-U85)

    @property
    def score(self) -> float:
        """What the sweep maximises: the program's top-1 %, else its SNR against float (dB)."""
        return self.accuracy.program_accuracy if self.accuracy is not None else self.output_snr_db


def parse_scheme(scheme: str) -> tuple[str, list[str]]:
    """'int8+2:4' -> ('int8', ['2:4']), each part checked (and the layer kind after an '@')."""
    body, at, selection = scheme.partition("@")
    if at and selection not in SELECTIONS:
        raise TosakitError(f"scheme {scheme!r}: unknown layer kind {selection!r} after '@'",
                           f"end it with one of: {', '.join('@' + k for k in SELECTIONS)}, or nothing for every layer")
    config, *transforms = body.split("+")
    if config not in SCHEMES:
        raise TosakitError(f"scheme {scheme!r}: unknown quantization {config!r}", f"start with one of: {', '.join(SCHEMES)}")
    unknown = [t for t in transforms if t not in TRANSFORMS]
    if unknown:
        raise TosakitError(f"scheme {scheme!r}: unknown weight transform(s) {', '.join(unknown)}",
                           f"add any of: {', '.join(TRANSFORMS)} (e.g. int8+2:4+cluster16)")
    return config, transforms


def unselected(model, scheme: str) -> tuple[str, ...]:
    """The layers of ``model`` outside the kind ``scheme`` names after its '@' (none without one)."""
    _, at, selection = scheme.partition("@")
    return tuple(n for n in _layers(model) if not SELECTIONS[selection](model.get_submodule(n))) if at else ()


def prepare(model, scheme: str, kept: tuple[str, ...] = ()):
    """``model`` as ``scheme`` takes it: (a copy with the weight transforms applied, or ``model`` itself when there
    are none; the quantization config; the per-module configs keeping plain int8 the layers named in ``kept`` and
    those outside the scheme's '@' kind). Fine-tune the copy before quantizing it, if you like."""
    config, transforms = parse_scheme(scheme)
    kept = tuple(kept) + unselected(model, scheme)
    return _transformed(model.eval(), transforms, kept), SCHEMES[config](), _kept_int8(config, kept)


def run_scheme(model_name: str, target: str, scheme: str, calibration: int = 64, limit: int | None = None,
               kept: tuple[str, ...] = ()) -> SweepRow:
    """One scheme, from the model's name (so a worker process rebuilds it): transforms applied, quantized,
    compiled, measured; the layers named in ``kept`` (and those outside the scheme's '@' kind) stay plain int8."""
    from .zoo import MODELS, load_model

    entry = MODELS.get(model_name)
    if entry is not None and entry.data is not None:
        return measure_model(entry.factory()[0], entry.data(), target, scheme, calibration, limit, kept)
    start = time.perf_counter()
    _, original, example = load_model(model_name)
    model, config, module_configs = prepare(original, scheme, kept)
    snr, compiled = _snr_on_seeded_inputs(model, original, example, target, config, module_configs)
    return _row(scheme, None, snr, compiled, start)


def measure_model(model, data, target: str, scheme: str, calibration: int = 64, limit: int | None = None,
                  kept: tuple[str, ...] = ()) -> SweepRow:
    """One scheme on a model of your own with its held-out ``data`` (a ``zoo.trained.Split``): ``model`` untouched,
    a copy transformed, quantized, compiled and measured; the layers named in ``kept`` (and those outside the
    scheme's '@' kind) stay plain int8."""
    start = time.perf_counter()
    variant, config, module_configs = prepare(model, scheme, kept)
    row, compiled = measure_scheme(variant, data, target, scheme, config, calibration, limit, reference=model,
                                   module_configs=module_configs)
    return _row(scheme, row, row.output_snr_db, compiled, start)


def _row(scheme: str, accuracy: SchemeAccuracy | None, snr: float, compiled, start: float) -> SweepRow:
    """The sweep's figures of one compiled scheme."""
    reports = [d.report for d in compiled.edge.delegates if d.report is not None]
    cpu = cpu_compute(compiled.edge.placements)
    cycles = sum(r.total_cycles for r in reports)
    macs = sum(r.mac_count for r in reports)
    per_cycle = max((r.macs_per_cycle for r in reports), default=0)
    return SweepRow(scheme, accuracy, snr, cycles, sum(r.weights_encoded_bytes for r in reports),
                    sum(r.offchip_used_bytes for r in reports), macs / (cycles * per_cycle) if cycles and per_cycle else 0.0,
                    len(cpu), time.perf_counter() - start,
                    tuple(OpFigures(op.name, op.operator, op.cycles, op.bound_by) for r in reports for op in r.per_op),
                    _sparse_ops(compiled))


def _sparse_ops(compiled) -> int:
    """How many NPU operations of the program's Ethos-U command streams read 2:4 sparse weights."""
    from .backends.ethosu.payload import parse_payload
    from .program import LoweredBackendModule
    from .runtime.ethosu.commands import decode, disassemble

    streams = [parse_payload(m.processed_bytes).cmd_data for m in compiled.edge.program.graph_module.children()
               if isinstance(m, LoweredBackendModule) and m.backend_id == "EthosUBackend"]
    return sum("WEIGHT_SPARSITY_SPARSE_2_4" in line for s in streams for line in disassemble(decode(s)))


def _kept_int8(config: str, kept) -> dict:
    """The quantizer's per-module configs that keep the layers ``kept`` plain int8."""
    return {name: SCHEMES["int8"]() for name in kept} if config != "int8" else {}


def _layers(model) -> list[str]:
    """The names of the convolution and linear layers the transforms and layer choice act on."""
    return [name for name, m in model.named_modules() if isinstance(m, LAYERS)]


def _transformed(model, transforms: list[str], kept=()):
    """A copy of ``model`` with the weight ``transforms`` applied to every layer but those ``kept`` (the model
    itself when there is nothing to do)."""
    chosen = [name for name in _layers(model) if name not in kept]
    if not transforms or not chosen:
        return model
    import copy

    model = copy.deepcopy(model).eval()
    for t in transforms:
        TRANSFORMS[t](model, chosen if kept else None)
    return model


def _snr_on_seeded_inputs(model, original, example: tuple, target: str, config, module_configs: dict):
    """The program's SNR against the float ``original`` over seeded inputs shaped like ``example`` (calibrated on
    ``example``)."""
    from .flow import compile
    from .runtime import LoadedProgram
    from .verify.report import Agreement

    compiled = compile(model, example, target, quantize=True, config=config, calibration=[example],
                       module_configs=module_configs)
    program = LoadedProgram(compiled.program.buffer, "the program", isolate=False)
    generator = torch.Generator().manual_seed(0)
    got, want = [], []
    for _ in range(EVALUATION_SAMPLES):
        inputs = tuple(torch.randn(x.shape, generator=generator) if x.is_floating_point() else x for x in example)
        got.append(program.run(list(inputs))[0].flatten())
        with torch.no_grad():
            out = original(*inputs)
        want.append((out[0] if isinstance(out, (tuple, list)) else out).flatten())
    return Agreement.of(torch.cat(got), torch.cat(want)).snr_db, compiled


def sweep(model_name: str, target: str, schemes: list[str] | tuple[str, ...] = DEFAULT_SCHEMES, jobs: int = 1,
          calibration: int = 64, limit: int | None = None, progress: bool | None = None,
          ray_address: str | None = None) -> list[SweepRow]:
    """Every scheme's row, in the order given; ``jobs`` > 1 compiles them in that many worker processes here, and
    ``ray_address`` ("auto", "ray://HEAD:10001", or "" for the cluster ``ray.init()`` finds or starts) as tasks of
    a Ray cluster instead, one per scheme, each on a CPU of its own (tosakit installed on every node)."""
    if not isinstance(compile_spec_for_target(target), EthosUCompileSpec):
        raise TosakitError(f"sweep measures what Vela makes of each scheme: {target} is not an Ethos-U target",
                           "give ethos-u55-128, ethos-u85-256, ...")
    for s in schemes:
        parse_scheme(s)
    from tqdm import tqdm

    show = sys.stderr.isatty() if progress is None else progress
    bar = tqdm(total=len(schemes), desc="schemes", unit="scheme", disable=not show, leave=False)
    rows: dict[str, SweepRow] = {}
    args = lambda s: (model_name, target, s, calibration, limit)  # noqa: E731
    if ray_address is not None:
        for s, row in _on_ray(ray_address, {s: args(s) for s in schemes}):
            rows[s] = row
            bar.update()
    elif jobs <= 1:
        for s in schemes:
            rows[s] = run_scheme(*args(s))
            bar.update()
    else:
        import multiprocessing

        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(run_scheme, *args(s)): s for s in schemes}
            for done in as_completed(futures):
                rows[futures[done]] = done.result()
                bar.update()
    bar.close()
    return [rows[s] for s in schemes]


def _on_ray(address: str, calls: dict):
    """(scheme, row) as each ``run_scheme(*calls[scheme])`` finishes as a task of the Ray cluster at ``address``;
    a Ray instance started here is shut down after."""
    try:
        import ray
    except ImportError:
        raise TosakitError("a sweep on a Ray cluster needs Ray installed", "pip install 'tosakit[cluster]' (Ray "
                           "2.60.0), or compile here with -j N") from None
    started = not ray.is_initialized()
    if started:
        ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1)(run_scheme)
        pending = {task.remote(*a): s for s, a in calls.items()}
        while pending:
            [done], _ = ray.wait(list(pending), num_returns=1)
            yield pending.pop(done), ray.get(done)
    finally:
        if started:
            ray.shutdown()


def pareto(rows: list[SweepRow], cost: str) -> set[str]:
    """The schemes no other scheme beats on both score (higher) and ``cost`` (a SweepRow field, lower)."""
    def beaten(r: SweepRow) -> bool:
        return any(o.score >= r.score and getattr(o, cost) <= getattr(r, cost) and
                   (o.score > r.score or getattr(o, cost) < getattr(r, cost)) for o in rows)

    return {r.scheme for r in rows if not beaten(r)}


def table(rows: list[SweepRow]) -> str:
    """The per-scheme table for the terminal; * marks the Pareto front on cycles, f on flash (encoded weights)."""
    by_cycles, by_flash = pareto(rows, "cycles"), pareto(rows, "weights_encoded_bytes")
    accuracy = rows[0].accuracy is not None
    head = (f"{'scheme':<20}" + (f"{'float %':>9}{'fake-q %':>10}{'program %':>11}" if accuracy else "")
            + f"{'SNR dB':>8}{'cycles':>13}{'weights B':>12}{'off-chip B':>12}{'MAC %':>7}{'CPU':>5}  front")
    lines = [head]
    for r in rows:
        a = r.accuracy
        acc = f"{a.float_accuracy:>9.2f}{a.fake_quant_accuracy:>10.2f}{a.program_accuracy:>11.2f}" if a else ""
        front = ("*" if r.scheme in by_cycles else " ") + ("f" if r.scheme in by_flash else " ")
        lines.append(f"{r.scheme:<20}{acc}{r.output_snr_db:>8.1f}{r.cycles:>13,}{r.weights_encoded_bytes:>12,}"
                     f"{r.offchip_bytes:>12,}{100 * r.mac_utilisation:>7.1f}{r.cpu_ops:>5}  {front}")
    lines.append("front: * no scheme is both more accurate and faster; f ... and smaller in flash")
    return "\n".join(lines)


@dataclass
class LayerChoice:
    """A scheme applied where it costs least: the layers kept in plain int8 for an accuracy budget."""

    scheme: str
    budget: float  # top-1 points the program may lose against float
    sensitivity: dict[str, float]  # each layer: points lost with the scheme on that layer alone (fake-quantized)
    kept: tuple[str, ...]  # kept in int8, most sensitive first
    row: SweepRow  # the mixed scheme, compiled and measured


def choose_layers(model: str | torch.nn.Module, target: str, scheme: str, budget: float = 1.0, calibration: int = 64,
                  limit: int | None = None, data=None) -> LayerChoice:
    """Keep in int8 the layers where ``scheme`` hurts accuracy most, one at a time, until the fake-quantized model
    (evaluated exactly) loses at most ``budget`` top-1 points against float; then compile and measure that mix.
    A layer's sensitivity is the accuracy lost with the scheme on it alone. ``model``: a built-in model's name
    (one with held-out data), or a module of your own with its held-out ``data`` (a ``zoo.trained.Split``)."""
    from .zoo import MODELS

    if isinstance(model, str):
        entry = MODELS.get(model)
        if entry is None or entry.data is None:
            with_data = [m.name for m in MODELS.values() if m.data is not None]
            raise TosakitError(f"choosing layers for an accuracy budget needs held-out data; {model!r} has none",
                               f"give a model with data ({', '.join(with_data)}), or a module and its data")
        model, data = entry.factory()[0], entry.data()
    elif data is None:
        raise TosakitError("choose_layers(module, ...) needs the module's held-out data",
                           "pass data=Split(train_x, train_y, test_x, test_y) (tosakit.zoo.trained.Split)")
    parse_scheme(scheme)
    original = model.eval()
    outside = unselected(original, scheme)
    layers = [n for n in _layers(original) if n not in outside]
    float_accuracy = _top1(original, data, limit)

    def loss(kept) -> float:
        return float_accuracy - _fake_quant_top1(*prepare(original, scheme, kept), data, target, calibration, limit)

    sensitivity = {name: loss(tuple(n for n in layers if n != name)) for name in layers}
    kept: tuple[str, ...] = ()
    for name in sorted(layers, key=lambda n: -sensitivity[n]):
        if loss(kept) <= budget:
            break
        kept += (name,)
    return LayerChoice(scheme, budget, sensitivity, kept,
                       measure_model(original, data, target, scheme, calibration, limit, kept))


def _top1(model, data, limit) -> float:
    x, y = data.test_x[:limit], data.test_y[:limit]
    import copy

    twin = copy.deepcopy(model).eval().double()
    with torch.no_grad():
        return 100.0 * float((twin(x.double()).argmax(-1) == y).double().mean())


def _fake_quant_top1(model, config, module_configs: dict, data, target, calibration: int, limit) -> float:
    from .flow import quantize_model
    from .runtime import evaluate_exact

    x, y = data.test_x[:limit], data.test_y[:limit]
    quantized = quantize_model(model, (x[:1],), compile_spec_for_target(target), config,
                               data.calibration(calibration), module_configs)
    logits = torch.cat([evaluate_exact(quantized, x[i:i + 1])[0] for i in range(len(x))])
    return 100.0 * float((logits.argmax(-1) == y).double().mean())
