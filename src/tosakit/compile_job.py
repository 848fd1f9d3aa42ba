"""A compile described by names and files — the Python twin of ``tosakit compile``'s flags — run through
``flow.compile``: the model loaded by name, the spec built from the options, the calibration and
verification inputs chosen, then the .pte and (with ``intermediates``) the reports written."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TosakitError

OTHER_FOLDER_HINT = "choose another -i folder"


class Progress:
    """One line per stage on stderr, with the time it took."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.start = time.perf_counter()

    def step(self, text: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.start:6.1f}s] {text}", file=sys.stderr, flush=True)


@dataclass
class CompileOptions:
    """Everything ``tosakit compile`` takes; the Python twin of its flags."""

    model_name: str
    target: str = "ethos-u55-128"
    delegate: bool = False
    quantize: bool = False
    system_config: str | None = None
    memory_mode: str | None = None
    config_ini: str | None = None
    extra_flags: str | None = None
    optimise: str | None = None
    arena_cache_size: int | None = None
    intermediates: str | None = None
    output: str | None = None
    input_shapes: list = field(default_factory=list)  # zoo.inputs.InputSpec, one per --input-shape
    debug_info: bool = False
    int8_io: bool = False
    channels_last: bool = False
    verify: bool = False
    inputs_file: str | None = None
    random_inputs: bool = False
    calibration: str | None = None
    quiet: bool = False
    cortex_m_fallback: str | None = None  # the core whose cortex_m:: kernels run what the delegate leaves
    bundleio: bool = False  # also write NAME.bpte: the program with a test case
    external_data: bool = False  # constants and Ethos-U blocks in NAME.ptd


@dataclass
class CompileRun:
    """What one ``tosakit compile`` produced."""

    output: Path
    edge: object
    program: object
    inputs: tuple
    model: object
    quantized: object | None
    verification: object | None = None
    calibrated_on: str | None = None  # what --quantize calibrated on, in words
    verified_on: str | None = None  # what --verify ran on, in words
    core: str = "cortex-m55"  # the Cortex-M core the CPU kernels' cycles are estimated for
    data_files: list = field(default_factory=list)  # the named-data files written (--external-data)


def default_output_name(model: str, target: str, delegate: bool) -> str:
    """The seed's names: ``mv2_arm_delegate_ethos-u55-128.pte``, ``softmax_arm_ethos-u55-128.pte``."""
    return f"{model}_arm{'_delegate' if delegate else ''}_{target}.pte"


def compile_model(opts: CompileOptions) -> CompileRun:
    """Run the whole flow for ``opts`` (and ``--verify``); writes the .pte and, with -i, the reports. Every
    option is checked before the work starts, and nothing is written when the flow fails."""
    from . import flow
    from .report import write_reports
    from .runtime.cpu_cycles import core_for
    from .program.manager import ExecutorchBackendConfig
    from .specs import EthosUCompileSpec, VelaExternalBlockPlacements, compile_spec_for_target
    from .zoo import load_model

    progress = Progress(opts.quiet)
    spec = compile_spec_for_target(opts.target, opts.system_config, opts.memory_mode, opts.extra_flags,
                                   opts.config_ini, opts.optimise, opts.arena_cache_size)
    folder = _check_options(opts)
    if opts.cortex_m_fallback:
        if not opts.delegate or not isinstance(spec, EthosUCompileSpec):
            raise TosakitError("--cortex-m-fallback runs what an Ethos-U delegate leaves on the CPU",
                               "add --delegate with an ethos-u target, or compile for the core itself (-t cortex-m55)")
        spec.with_cortex_m_fallback(opts.cortex_m_fallback)
    name, model, inputs = load_model(opts.model_name, opts.input_shapes or None)
    if opts.channels_last:  # 4-D inputs stored NHWC: the delegate takes them with no layout TRANSPOSE
        inputs = _channels_last(inputs)
    output = Path(opts.output or default_output_name(name, opts.target, opts.delegate))
    check_output(output, folder)
    calibration, calibrated_on = _calibration(opts, name, inputs)
    check_inputs, verified_on = _verify_inputs(opts, inputs, given=calibration is not None)
    if folder is not None:
        spec.dump_intermediate_artifacts_to(str(folder))
    spec.embed_tosa = opts.debug_info
    backend_config = None
    if opts.external_data:  # ExecuTorch's files are <tag>.ptd: the tag is the program's name
        backend_config = ExecutorchBackendConfig(external_constants=output.stem)
        if isinstance(spec, EthosUCompileSpec):
            spec.external_block_placements = VelaExternalBlockPlacements(output.stem, output.stem)
    if opts.int8_io:
        spec.with_int8_io()
    stages = {
        "export": f"exporting {name} ({type(model).__name__}) with torch.export",
        "quantize": f"quantizing: int8 activations, int8 per-channel weights, calibrated on {calibrated_on}",
        "lower": "partitioning and lowering" + (f" for {opts.target}" if opts.delegate else " (no delegate)"),
        "verify": f"verifying on the host against float PyTorch and the fake-quantized model, on {verified_on}",
    }
    compiled = flow.compile(model, inputs, spec, quantize=opts.quantize, delegate=opts.delegate,
                            calibration=calibration, progress=lambda stage: progress.step(stages[stage]),
                            verify_on=check_inputs if opts.verify else None, verify_layers=folder is not None,
                            backend_config=backend_config)
    quantized = compiled.quantized
    if quantized is not None and not any("quantize_per" in str(n.target) for n in quantized.graph.nodes):
        kinds = ", ".join(sorted({str(t.dtype).replace("torch.", "") for t in inputs}))
        calibrated_on = f"nothing: the model has no float op to quantize (its inputs are {kinds}); it runs as it is"
    run = CompileRun(output, compiled.edge, compiled.program, inputs, model, quantized, compiled.verification,
                     calibrated_on if opts.quantize else None, verified_on if opts.verify else None,
                     core_for(opts.target, opts.cortex_m_fallback))
    progress.step("writing the program")
    run.program.save(output)
    run.data_files = run.program.write_tensor_data_to_file(output.parent)
    if opts.bundleio:
        write_bundled(run, output.with_suffix(".bpte"), check_inputs if opts.inputs_file else inputs)
    if folder is not None:
        write_reports(folder, opts.model_name, opts.target, output, run.edge, run.program, run.verification,
                      run.core)
    return run


def write_bundled(run: CompileRun, path: Path, inputs: tuple) -> None:
    """``path``: the program with one test case, ``inputs`` and the outputs expected of them (the fake-quantized
    model's when quantized, evaluated exactly: the program is within one output step of it; else the float
    model's), as ExecuTorch's ``--bundleio`` writes it."""
    import torch

    from .errors import write_atomic
    from .program.bundled import (BundledProgram, MethodTestCase, MethodTestSuite,
                                  serialize_from_bundled_program_to_flatbuffer)
    from .runtime import evaluate_exact

    with torch.no_grad():
        expected = evaluate_exact(run.quantized, *inputs) if run.quantized is not None else run.model(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    case = MethodTestCase(list(inputs), [t.detach() for t in expected])
    bundled = BundledProgram(run.program, [MethodTestSuite("forward", [case])])
    write_atomic(path, serialize_from_bundled_program_to_flatbuffer(bundled))


def output_step(run: CompileRun) -> float:
    """The largest quantization step among the program's dequantized outputs (0.0 when none is)."""
    from .quantize.qdq import is_dequantize, qparams_of

    gm = run.edge.program.graph_module
    outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    steps = [float(qparams_of(n, gm).s) for n in outputs if is_dequantize(n)]
    return max(steps, default=0.0)


def _check_options(opts: CompileOptions) -> Path | None:
    """Refuse options that do not go together; the reports folder (-i), if any."""
    if opts.int8_io and not (opts.quantize and opts.delegate):
        raise TosakitError("--int8-io needs --quantize and --delegate", "add both, or drop --int8-io")
    if opts.calibration and not opts.quantize:
        raise TosakitError("--calibration is for --quantize", "add --quantize, or drop --calibration")
    if opts.bundleio and opts.external_data:
        raise TosakitError("--bundleio bundles the .pte alone; --external-data puts its data in a .ptd beside it",
                           "choose one of --bundleio and --external-data")
    if opts.bundleio and opts.int8_io:
        raise TosakitError("--bundleio bundles float inputs and outputs; --int8-io makes the program take integers",
                           "drop one of them")
    folder = Path(opts.intermediates) if opts.intermediates else None
    if folder is not None and folder.exists() and not folder.is_dir():
        raise TosakitError(f"-i {folder} is a file, not a folder", "name a folder for the reports (it is created)")
    return folder


def _channels_last(inputs: tuple) -> tuple:
    """The 4-D inputs stored channels-last (NHWC); the others as they are."""
    import torch

    return tuple(t.to(memory_format=torch.channels_last) if t.dim() == 4 else t for t in inputs)


def check_output(output: Path, folder: Path | None = None) -> None:
    """Refuse, before any work, an output the compile could not write (and make the reports folder)."""
    if output.is_dir():
        raise TosakitError(f"-o {output} is a folder", f"name the .pte file, e.g. -o {output / 'model.pte'}")
    if output.suffix != ".pte":
        raise TosakitError(f"output {output} does not end in .pte", "name the output file like model.pte")
    parent = output.parent if str(output.parent) else Path(".")
    if not parent.is_dir():
        raise TosakitError(f"output folder {parent} does not exist", "create it or choose another -o path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise TosakitError(f"cannot write {output}: folder {parent} is read-only", "choose another -o path")
    if folder is not None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TosakitError(f"cannot create the reports folder -i {folder}: {exc.strerror}",
                               OTHER_FOLDER_HINT) from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise TosakitError(f"cannot write reports to -i {folder}: it is read-only", OTHER_FOLDER_HINT)


def _calibration(opts: CompileOptions, name: str, example: tuple) -> tuple[list[tuple] | None, str]:
    """What --quantize calibrates on: ``--calibration PATH``, a trained built-in model's training data, or
    (None) the example inputs; and that, in words."""
    from .zoo import MODELS

    if opts.calibration:
        from .quantize.data import read_calibration

        samples = read_calibration(opts.calibration, example)
        return samples, f"{len(samples)} sample(s) from {opts.calibration}"
    zoo = MODELS.get(opts.model_name)
    if opts.quantize and zoo is not None and zoo.data is not None:
        samples = zoo.data().calibration(64)
        return samples, f"{len(samples)} training samples of {name}"
    return None, "the example input (one sample: pass --calibration PATH with representative data)"


def _verify_inputs(opts: CompileOptions, example: tuple, given: bool) -> tuple[tuple, str]:
    """What --verify runs on, and that in words: --inputs FILE, --random, or by default the example inputs
    when they were not what the program was calibrated on, else seeded random inputs (a quantized program
    verified on its own calibration sample would look better than it is)."""
    from .runtime.io import random_inputs, read_inputs

    random = opts.random_inputs or (opts.quantize and not given and not opts.inputs_file)
    if opts.inputs_file:
        chosen = tuple(read_inputs(opts.inputs_file, len(example)))
        for i, (got, want) in enumerate(zip(chosen, example)):
            if tuple(got.shape) != tuple(want.shape) or got.dtype != want.dtype:
                kind = lambda t: f"{str(t.dtype).replace('torch.', '')}[{'x'.join(map(str, t.shape))}]"  # noqa: E731
                raise TosakitError(f"--inputs {opts.inputs_file}: input {i} is {kind(got)}, the model takes {kind(want)}",
                                   f"save arg{i} as {kind(want)}")
        return chosen, f"the inputs in {opts.inputs_file}"
    if random:
        import torch

        # integers (token ids, lengths, positions) drawn from the example's own range: a model indexes with them
        ranges = [None if t.dtype.is_floating_point or t.dtype == torch.bool or not t.numel()
                  else (int(t.min()), int(t.max())) for t in example]
        chosen = tuple(random_inputs([(t.dtype, tuple(t.shape)) for t in example], seed=0, ranges=ranges))
        if opts.channels_last:
            chosen = _channels_last(chosen)
        why = "" if opts.random_inputs else ", not the calibration sample"
        return chosen, f"seeded random inputs (seed 0{why})"
    return example, "the example input" + (" (not used for calibration)" if given else "")
