"""The ``tosakit`` command: compile (like ExecuTorch's aot_arm_compiler), models, demo."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TosakitError, first_line

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1
EXIT_INTERRUPTED = 130


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
    input_shapes: list[tuple[int, ...]] = field(default_factory=list)
    debug_info: bool = False
    int8_io: bool = False
    channels_last: bool = False
    verify: bool = False
    inputs_file: str | None = None
    random_inputs: bool = False
    calibration: str | None = None
    quiet: bool = False


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


def default_output_name(model: str, target: str, delegate: bool) -> str:
    """The seed's names: ``mv2_arm_delegate_ethos-u55-128.pte``, ``softmax_arm_ethos-u55-128.pte``."""
    return f"{model}_arm{'_delegate' if delegate else ''}_{target}.pte"


def _shape(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(d) for d in text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--input-shape {text!r}: write dimensions like 1,3,224,224") from None
    if not dims or any(d <= 0 for d in dims):
        raise argparse.ArgumentTypeError(f"--input-shape {text!r}: dimensions must be positive integers")
    return dims


def compile_model(opts: CompileOptions) -> CompileRun:
    """Run the whole flow for ``opts`` (and ``--verify``); writes the .pte and, with -i, the reports. Every
    option is checked before the work starts, and nothing is written when the flow fails."""
    from .capture import export
    from .flow import partitioner_for, quantize_model
    from .program import to_edge_transform_and_lower
    from .specs import compile_spec_for_target
    from .zoo import load_model

    progress = Progress(opts.quiet)
    arena = opts.arena_cache_size is not None and f"--arena-cache-size={opts.arena_cache_size}"
    vela_flags = " ".join(filter(None, [opts.extra_flags, opts.optimise and f"--optimise={opts.optimise}", arena]))
    spec = compile_spec_for_target(opts.target, opts.system_config, opts.memory_mode, vela_flags or None,
                                   opts.config_ini)
    if opts.int8_io and not (opts.quantize and opts.delegate):
        raise TosakitError("--int8-io needs --quantize and --delegate", "add both, or drop --int8-io")
    if opts.calibration and not opts.quantize:
        raise TosakitError("--calibration is for --quantize", "add --quantize, or drop --calibration")
    folder = Path(opts.intermediates) if opts.intermediates else None
    if folder is not None and folder.exists() and not folder.is_dir():
        raise TosakitError(f"-i {folder} is a file, not a folder", "name a folder for the reports (it is created)")
    name, model, inputs = load_model(opts.model_name, opts.input_shapes or None)
    if opts.channels_last:  # 4-D inputs stored NHWC: the delegate takes them with no layout TRANSPOSE
        import torch

        inputs = tuple(t.to(memory_format=torch.channels_last) if t.dim() == 4 else t for t in inputs)
    output = Path(opts.output or default_output_name(name, opts.target, opts.delegate))
    check_output(output, folder)
    calibration, calibrated_on = _calibration(opts, name, inputs)
    check_inputs, verified_on = _verify_inputs(opts, inputs, given=calibration is not None)
    if folder is not None:
        spec.dump_intermediate_artifacts_to(str(folder))
    spec.embed_tosa = opts.debug_info
    if opts.int8_io:
        spec.with_int8_io()
    progress.step(f"exporting {name} ({type(model).__name__}) with torch.export")
    quantized = None
    if opts.quantize:
        progress.step(f"quantizing: int8 activations, int8 per-channel weights, calibrated on {calibrated_on}")
        quantized = quantize_model(model, inputs, spec, calibration=calibration)
    ep = export(quantized if quantized is not None else model, inputs)
    partitioners = [partitioner_for(spec)] if opts.delegate else []
    progress.step("partitioning and lowering" + (f" for {opts.target}" if opts.delegate else " (no delegate)"))
    edge = to_edge_transform_and_lower(ep, partitioner=partitioners)
    program = edge.to_executorch()
    if quantized is not None and not any("quantize_per" in str(n.target) for n in quantized.graph.nodes):
        kinds = ", ".join(sorted({str(t.dtype).replace("torch.", "") for t in inputs}))
        calibrated_on = f"nothing: the model has no float op to quantize (its inputs are {kinds}); it runs as it is"
    run = CompileRun(output, edge, program, inputs, model, quantized,
                     calibrated_on=calibrated_on if opts.quantize else None)
    if opts.verify:
        from .verify.run import verify

        progress.step(f"verifying on the host against float PyTorch and the fake-quantized model, on {verified_on}")
        run.verification = verify(edge, program, check_inputs, model, quantized, layers=folder is not None)
        run.verified_on = verified_on
    progress.step("writing the program")
    program.save(output)
    if folder is not None:
        _write_intermediates(folder, run, opts)
    return run


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
                               "choose another -i folder") from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise TosakitError(f"cannot write reports to -i {folder}: it is read-only", "choose another -i folder")


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
            chosen = tuple(t.to(memory_format=torch.channels_last) if t.dim() == 4 else t for t in chosen)
        why = "" if opts.random_inputs else ", not the calibration sample"
        return chosen, f"seeded random inputs (seed 0{why})"
    return example, "the example input" + (" (not used for calibration)" if given else "")


def _write_intermediates(folder: Path, run: CompileRun, opts: CompileOptions) -> None:
    from .report import write_html, write_layers_csv

    write_report(folder / "report.json", run.edge, run.program, opts, run.output, run.verification)
    if run.verification is not None and run.verification.layers:
        write_layers_csv(folder / "layers.csv", run.verification.layers)
    write_html(folder / "report.html", f"{opts.model_name} -> {opts.target}", run.edge, run.program, run.verification)


def write_report(path: Path, edge, program, opts: CompileOptions, output: Path, verification=None) -> None:
    """The delegation report as JSON: where every op runs, and each delegate's figures."""
    from .errors import write_atomic

    report = {
        "model": opts.model_name,
        "target": opts.target,
        "output": str(output),
        "pte_bytes": len(program.buffer),
        "arena_bytes": program.emitted.arena_bytes,
        "constant_bytes": program.emitted.constant_bytes,
        "cpu_kernels": program.emitted.kernel_ops,
        "runner_memory": [m.as_dict() for m in _runner_memory(program)],
        "placements": [vars(p) for p in edge.placements],
        "delegates": [
            {**{k: v for k, v in vars(d).items() if k != "report"},
             "vela": _vela_dict(d.report)} for d in edge.delegates
        ],
    }
    if verification is not None:
        report["verification"] = {
            "outputs": [{"index": o.index, "shape": list(o.shape), "vs_float": _plain(o.vs_float),
                         "vs_fake_quant": _plain(o.vs_fake_quant)} for o in verification.outputs],
            "layers": [{**{k: v for k, v in vars(lay).items() if k != "vs_float"}, "vs_float": _plain(lay.vs_float),
                        "matches": lay.matches} for lay in verification.layers],
            "npu_vs_tosa": [{**vars(c), "bit_exact": c.bit_exact} for c in verification.engines],
            "npu_error": verification.npu_error,
            "npu_operations": [vars(r) for r in verification.npu_ops],
        }
    write_atomic(path, json.dumps(report, indent=2, default=str).encode())


def _plain(agreement) -> dict | None:
    if agreement is None:
        return None
    return {k: (str(v) if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))) else v)
            for k, v in vars(agreement).items()}


def _vela_dict(report) -> dict | None:
    if report is None:
        return None
    fields = ("sram_used_bytes", "offchip_used_bytes", "npu_cycles", "total_cycles", "mac_count", "npu_ops",
              "cpu_ops", "inference_time_s", "clock_hz", "system_config", "memory_mode", "macs_per_cycle",
              "mac_utilisation", "ideal_cycles", "bound_by")
    out = {f: getattr(report, f, None) for f in fields}
    out["per_op"] = [vars(o) for o in report.per_op]
    return out


def _runner_memory(program) -> list:
    """Each method's RunnerMemory."""
    from .runtime.pools import runner_memory

    emitted = program.emitted
    return [runner_memory(emitted.program, emitted.segments, plan) for plan in emitted.program.execution_plan]


def summary(output: Path, edge, program, seconds: float) -> str:
    """What runs where, and Vela's figures, for the terminal."""
    lines = []
    compute = [p for p in edge.placements if "quantize" not in p.target]
    on_cpu = [p for p in edge.placements if p.placement == "cpu"]
    delegated = sum(1 for p in compute if p.placement == "delegate")
    lines.append(f"ops: {delegated} of {len(compute)} compute ops delegated; "
                 f"{len(on_cpu)} op(s) on the CPU")
    for d in edge.delegates:
        ops = ", ".join(f"{k} {v}" for k, v in sorted(d.tosa_ops.items(), key=lambda kv: -kv[1]))
        lines.append(f"delegate {d.name} -> {d.backend_id} ({d.target}): {d.node_count} graph nodes, "
                     f"payload {d.payload_bytes / 1024:.1f} KiB")
        lines.append(f"  TOSA: {ops}")
        if d.report is not None:
            r = d.report
            lines.append(f"  Vela: SRAM used {r.sram_used_bytes / 1024:.2f} KiB, off-chip used "
                         f"{r.offchip_used_bytes / 1024:.2f} KiB, {r.total_cycles:,} cycles estimated "
                         f"({r.inference_time_s * 1e3:.3f} ms at {r.clock_hz / 1e6:.0f} MHz), "
                         f"MAC utilisation {100 * r.mac_utilisation:.1f}%, "
                         f"{r.npu_ops} NPU op(s), {r.cpu_ops} CPU op(s)")
            if r.bound_by:
                lines.append("  cycles bound by: " + ", ".join(f"{k} {100 * v:.0f}%" for k, v in r.bound_by.items()))
            if r.memory_hint:
                lines.append(f"  hint: {r.memory_hint}")
            if r.memory_mode.startswith("Dedicated_Sram"):  # the SRAM Vela plans is region 2, the runner's to lend
                lines.append(f"  fast scratch: {r.sram_used_bytes} B of SRAM the runner lends this delegate "
                             "(ET_ARM_BAREMETAL_FAST_SCRATCH_TEMP_ALLOCATOR_POOL_SIZE)")
    for p in on_cpu:
        where = f" [{p.source}]" if p.source else ""
        lines.append(f"cpu: {p.node} ({p.target}): {p.reason}{where}")
    if program.emitted.kernel_ops:
        lines.append(f"CPU kernels: {', '.join(program.emitted.kernel_ops)}")
    for kind, qs in (edge.io_quantization or {}).items():
        for i, q in enumerate(qs):
            if q is not None:
                lines.append(f"{kind[:-1]} {i}: {str(q.dtype).replace('torch.', '')}, scale {q.s:.9g}, zero point {q.zp}"
                             " (real = (q - zero point) x scale)")
    lines += [m.summary() for m in _runner_memory(program)]
    lines.append(f"wrote {output} ({len(program.buffer) / 1024:.1f} KiB; arena {program.emitted.arena_bytes} B) "
                 f"in {seconds:.1f} s")
    return "\n".join(lines)


def _cmd_compile(args) -> int:
    opts = CompileOptions(
        model_name=args.model_name, target=args.target, delegate=args.delegate, quantize=args.quantize,
        system_config=args.system_config, memory_mode=args.memory_mode, config_ini=args.config_ini,
        extra_flags=args.extra_flags, optimise=args.optimise, arena_cache_size=args.arena_cache_size,
        intermediates=args.intermediates, output=args.output,
        input_shapes=args.input_shape or [], debug_info=args.debug_info, int8_io=args.int8_io,
        channels_last=args.channels_last, verify=args.verify,
        inputs_file=args.inputs, random_inputs=args.random, calibration=args.calibration, quiet=args.quiet,
    )
    start = time.perf_counter()
    run = compile_model(opts)
    print(summary(run.output, run.edge, run.program, time.perf_counter() - start))
    if run.calibrated_on:
        print(f"calibrated on {run.calibrated_on}")
    if run.verification is not None:
        print(f"verified on {run.verified_on}")
        print(run.verification.table())
    if opts.intermediates:
        print(f"reports: {Path(opts.intermediates) / 'report.html'}, report.json"
              + (", layers.csv" if run.verification is not None and run.verification.layers else ""))
    return 0


def _cmd_run(args) -> int:
    import numpy as np

    from .runtime import load

    if args.verify and args.engine == "tosa":
        raise TosakitError("--verify compares the NPU engine's results with the TOSA ones: it runs --engine npu",
                           "drop --engine tosa")
    program = load(args.pte, limits=_limits(args), engine=args.engine)  # validated whole before torch is imported
    if args.method_pool is not None or args.temp_pool is not None:
        from .runtime.pools import check_pools, runner_memory

        plan = program.plan()
        check_pools(plan, runner_memory(program.program, program.segments, plan), args.method_pool, args.temp_pool)
    import torch

    from .runtime.io import random_inputs, read_inputs, write_outputs

    specs = program.input_specs()
    if args.inputs:
        inputs = read_inputs(args.inputs, len(specs))
    elif args.random:
        inputs = random_inputs([(s.dtype, s.shape) for s in specs], seed=args.seed)
    else:
        raise TosakitError("tosakit run needs inputs", "pass --inputs file.npz (arrays arg0, arg1, ...) or --random")
    start = time.perf_counter()
    if args.verify:
        from .verify.npu_ops import compare_call

        outputs, comparisons, operations = program.run_and_check(inputs, compare_call)
    else:
        outputs, comparisons, operations = program.run(inputs), [], []
    seconds = time.perf_counter() - start
    for i, out in enumerate(outputs):
        desc = f"output {i}: {str(out.dtype).replace('torch.', '')}{list(out.shape)}"
        if out.numel():
            o = out.double()
            desc += f" min {float(o.min()):.6g} max {float(o.max()):.6g} mean {float(o.mean()):.6g}"
        if out.dim() == 2 and out.shape[-1] > 1 and out.is_floating_point():
            desc += f"; top-5 classes {out[0].topk(min(5, out.shape[-1])).indices.tolist()}"
        print(desc)
    simulated = len(program.layouts["forward"].delegate_npu)
    print(f"ran {args.pte} in {seconds:.3f} s" + (f" ({simulated} Ethos-U delegate(s) on the NPU simulator)"
                                                 if simulated else ""))
    for c in comparisons:
        print(f"npu vs tosa: {c}")
    if operations:
        from .verify.npu_ops import summary

        print("\n".join(summary(operations)))
    if args.outputs:
        # numpy has no bfloat16: such outputs are written widened to float32
        write_outputs(args.outputs, [np.asarray(o.float() if o.dtype == torch.bfloat16 else o) for o in outputs])
        print(f"wrote {args.outputs}")
    differ = [c for c in comparisons if not c.bit_exact]
    ops_differ = [r for r in operations if r.differ]
    if differ or ops_differ:
        print(f"the NPU simulator and the TOSA reference model differ on {len(differ)} delegate output(s) and "
              f"{len(ops_differ)} NPU operation(s): report the program to tosakit", file=sys.stderr)
        return 1
    return 0


def _limits(args):
    from .runtime import Limits

    return Limits(max_memory=args.max_memory, timeout=args.timeout)


def _bytes(text: str) -> int:
    """A byte count: 1000000, 512M, 2G (binary units)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    number, unit = text.upper().rstrip("IB").rstrip(), ""
    if number and number[-1] in units:
        number, unit = number[:-1], number[-1]
    try:
        value = int(float(number) * units[unit])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size: write e.g. 1000000, 512M or 2G") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be positive")
    return value


def _pool_bytes(text: str) -> int:
    """A pool size: 0 (an empty pool) or a size as ``_bytes`` reads it."""
    return 0 if text.strip() == "0" else _bytes(text)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the timeout must be positive")
    return value


def _add_limits(p, memory: str = "1G") -> None:
    p.add_argument("--max-memory", "--max_memory", type=_bytes, default=_bytes(memory), metavar="SIZE",
                   help=f"refuse a program that needs more memory than this (default {memory}; e.g. 512M, 4G)")
    p.add_argument("--timeout", type=_seconds, default=600.0, metavar="SECONDS",
                   help="stop a run that takes longer (default 600)")


def _cmd_generate(args) -> int:
    """A decoder's prefill and decode programs, written; greedy tokens from them on the host vs the
    fake-quantized models; Vela's cycles per call."""
    import torch

    from .generate import compile_decoder, generate
    from .specs import compile_spec_for_target
    from .zoo.field import hf_decoder

    progress = Progress(args.quiet)
    spec = compile_spec_for_target(args.target, args.system_config, args.memory_mode)
    if args.prompt_length < 1 or args.steps < 0:
        raise TosakitError("--prompt-length must be at least 1 and --steps at least 0", "give positive counts")
    positions = args.max_positions or args.prompt_length + args.steps
    model = hf_decoder(args.model_name, args.layers, positions, cache_in_place=args.kv_cache == "in-place")
    folder = Path(args.output or f"{args.model_name.rsplit('/', 1)[-1]}_{args.target}")
    if folder.exists() and not folder.is_dir():
        raise TosakitError(f"-o {folder} is a file, not a folder", "name a folder for the programs")
    folder.mkdir(parents=True, exist_ok=True)
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_length),
                           generator=torch.Generator().manual_seed(args.seed), dtype=torch.int32)
    c = model.config
    progress.step(f"compiling {args.model_name} ({c.num_hidden_layers} layers, random weights) for {spec.target_name}: "
                  f"prefill {args.prompt_length} tokens and decode 1, KV cache {positions} positions")
    start = time.perf_counter()
    programs = compile_decoder(model, prompt, spec, folder, steps=args.steps)
    for which in ("prefill", "decode"):
        compiled = getattr(programs, which)
        cpu = [p for p in compiled.edge.placements if p.placement == "cpu" and "quantize" not in p.target]
        print(f"{which}: {programs.paths[which]} method {programs.methods[which]}, {len(compiled.edge.delegates)} "
              f"delegate(s), {len(cpu)} CPU compute op(s), {programs.cycles(which):,} cycles per call")
    print(f"compiled in {time.perf_counter() - start:.1f} s")
    progress.step(f"generating: prefill and {args.steps} decode steps from the .pte files, and from the "
                  "fake-quantized models")
    want, _ = generate(programs.fake_quant_step(), model, prompt, args.steps)
    got, _ = generate(programs.program_step(limits=_limits(args)), model, prompt, args.steps)
    print(f"tokens from the programs:           {got}")
    print(f"tokens from the fake-quantized models: {want}")
    if got != want:
        print("the programs' tokens differ from the fake-quantized models'")
        return 1
    print(f"equal: {len(got)} tokens")
    return 0


def _cmd_inspect(args) -> int:
    from .runtime import load
    from .runtime.inspect import command_listing, describe

    program = load(args.pte, limits=_limits(args))
    print(describe(program, Path(args.pte).stat().st_size))
    if args.commands:
        print(command_listing(program))
    return 0


def _cmd_accuracy(args) -> int:
    """Accuracy of a trained zoo model on its held-out data, per quantization scheme."""
    from .accuracy import measure, table
    from .zoo import MODELS

    model = MODELS.get(args.model_name)
    if model is None or model.data is None:
        trained = [m.name for m in MODELS.values() if m.data is not None]
        raise TosakitError(f"no held-out data for model {args.model_name!r}",
                           f"accuracy needs a trained model with its data: {', '.join(trained)}")
    module, example = model.factory()
    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    if args.calibration.isdigit() and int(args.calibration) > 0:
        calibration, described = int(args.calibration), f"{int(args.calibration)} training samples"
    else:
        from .quantize.data import read_calibration

        calibration = read_calibration(args.calibration, example)
        described = f"{len(calibration)} sample(s) from {args.calibration}"
    rows = measure(module, model.data(), args.target, schemes, calibration, args.limit,
                   layers=bool(args.intermediates))
    print(f"{args.model_name} on {args.target}, {len(model.data().test_x[:args.limit])} held-out samples, "
          f"calibrated on {described}:")
    print(table(rows))
    if args.intermediates:
        from .report import write_accuracy_html

        folder = Path(args.intermediates)
        folder.mkdir(parents=True, exist_ok=True)
        write_accuracy_html(folder / "report.html", f"{args.model_name} accuracy on {args.target}", rows)
        print(f"report: {folder / 'report.html'}")
    return 0


def _cmd_sweep(args) -> int:
    """Every weight scheme for a model and a target: accuracy, Vela's figures, the Pareto front, report.html."""
    from .sweep import DEFAULT_SCHEMES, pareto, sweep, table

    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()] if args.schemes else list(DEFAULT_SCHEMES)
    if args.jobs < 1:
        raise TosakitError(f"--jobs {args.jobs}: give at least 1", "--jobs 2 compiles two schemes at a time")
    rows = sweep(args.model_name, args.target, schemes, args.jobs, args.calibration, args.limit,
                 ray_address=args.ray)
    if args.choose:
        from dataclasses import replace

        from .sweep import choose_layers

        choice = choose_layers(args.model_name, args.target, args.choose, args.budget, args.calibration, args.limit)
        print(f"{args.choose}, each layer alone (top-1 points lost, fake-quantized): "
              + ", ".join(f"{n} {v:.2f}" for n, v in sorted(choice.sensitivity.items(), key=lambda kv: -kv[1])))
        print(f"kept in int8 for a {args.budget:g}-point budget: {', '.join(choice.kept) or 'none'}")
        rows.append(replace(choice.row, scheme=f"{args.choose}~{len(choice.kept)}int8"))
    print(f"{args.model_name} on {args.target}:")
    print(table(rows))
    if args.intermediates:
        from .report import write_sweep_html

        folder = Path(args.intermediates)
        folder.mkdir(parents=True, exist_ok=True)
        fronts = {cost: pareto(rows, cost) for cost in ("cycles", "weights_encoded_bytes")}
        write_sweep_html(folder / "report.html", f"{args.model_name}: weight schemes on {args.target}", rows, fronts)
        print(f"report: {folder / 'report.html'}")
    return 0


def _cmd_models(args) -> int:
    from .zoo import MODELS

    from .zoo.field import HF_MODELS, SOURCES

    width = max(len(n) for n in MODELS)
    for m in MODELS.values():
        print(f"{m.name:<{width}}  {m.description}")
    print(f"\nand the field's own definitions, random weights (the models extra): "
          f"{', '.join(f'{s}:NAME' for s in SOURCES)}; hf: {', '.join(HF_MODELS)}")
    return 0


def _cmd_demo(args) -> int:
    """Compile the tutorial's programs and a trained model, and judge each on the host against PyTorch."""
    from .demo import run

    return run(Path(args.output_dir))


def build_parser() -> argparse.ArgumentParser:
    from .specs import ALL_TARGETS

    parser = argparse.ArgumentParser(prog="tosakit", description="PyTorch to Arm Ethos-U / VGF via TOSA, as .pte")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile a model to a .pte (like ExecuTorch's aot_arm_compiler)")
    c.add_argument("-m", "--model_name", "--model-name", required=True,
                   help="zoo name (see `tosakit models`) or path/file.py:ClassOrFactory")
    c.add_argument("-t", "--target", default="ethos-u55-128", help=f"one of: {', '.join(ALL_TARGETS)}")
    c.add_argument("--delegate", action="store_true", help="delegate what the target runs (else: CPU only)")
    c.add_argument("--quantize", action="store_true",
                   help="int8 post-training quantization, calibrated on --calibration data (else the example input; "
                        "a trained built-in model: its training data)")
    c.add_argument("--calibration", metavar="PATH",
                   help="calibration samples for --quantize: an .npz (arg0, ... shaped [N, ...] for N samples), .npy, "
                        ".pt, or a folder of such files")
    c.add_argument("--system_config", "--system-config", help="Vela system config (Ethos-U)")
    c.add_argument("--memory_mode", "--memory-mode", help="Vela memory mode (Ethos-U)")
    c.add_argument("--config_ini", "--config-ini", help="Vela .ini file (default Arm/vela.ini)")
    c.add_argument("--extra_flags", "--extra-flags", help="extra Vela flags, e.g. '--verbose-allocation'")
    c.add_argument("--optimise", metavar="{Performance,Size}",
                   help="Vela's goal: fewest cycles (default) or least SRAM")
    c.add_argument("--arena_cache_size", "--arena-cache-size", type=int, metavar="BYTES",
                   help="SRAM Vela may use for the arena (Sram_Only/Shared_Sram) or its cache (Dedicated_Sram); "
                        "a program that needs more is an error")
    c.add_argument("-i", "--intermediates", metavar="DIR", help="write TOSA, Vela output and report.json here")
    c.add_argument("-o", "--output", help="output .pte (default: <model>_arm[_delegate]_<target>.pte)")
    c.add_argument("--input-shape", "--input_shape", type=_shape, action="append",
                   help="example input shape for a model file without example inputs (repeat per input)")
    c.add_argument("--debug-info", "--debug_info", action="store_true",
                   help="carry each delegate's TOSA inside the .pte (for running it on the host)")
    c.add_argument("--channels-last", "--channels_last", action="store_true",
                   help="export with channels-last (NHWC) 4-D inputs: the .pte's inputs have dim order [0, 2, 3, 1] "
                        "and the delegate needs no layout TRANSPOSE")
    c.add_argument("--int8-io", "--int8_io", action="store_true",
                   help="the program takes and returns quantized integers: no CPU quantize/dequantize around the "
                        "delegate (firmware feeds int8 directly); the I/O quantization is printed")
    c.add_argument("--verify", action="store_true",
                   help="run the program on the host against float PyTorch and the fake-quantized model "
                        "(per layer too, with -i)")
    c.add_argument("--inputs", help="inputs for --verify: an .npz with arrays arg0, arg1, ... (default: the example "
                                    "input, or seeded random inputs when it was the calibration sample)")
    c.add_argument("--random", action="store_true", help="seeded random inputs for --verify")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    c.set_defaults(func=_cmd_compile)
    r = sub.add_parser("run", help="run a .pte on the host (CPU ops in PyTorch, Ethos-U delegates on the "
                                   "command-stream simulator, other delegates on the TOSA reference model)")
    r.add_argument("pte")
    r.add_argument("--engine", choices=("npu", "tosa"),  # runtime.validate.ENGINES (not imported: slow)
                   help="how Ethos-U delegates run: npu, their command stream on the simulator (Ethos-U55, U65, "
                        "U85), or tosa, the TOSA they carry (--debug-info) on the reference model (default: npu "
                        "when the stream is one the simulator runs, else tosa)")
    r.add_argument("--verify", action="store_true",
                   help="also run each simulated Ethos-U delegate's carried TOSA on the same inputs and compare, per "
                        "delegate output (exit 1 if they differ)")
    r.add_argument("--inputs", help=".npz with arrays arg0, arg1, ... (or in file order)")
    r.add_argument("--random", action="store_true", help="seeded random inputs of the program's shapes")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--outputs", help="write the outputs to this .npz (out0, out1, ...)")
    r.add_argument("--method-pool", "--method_pool", type=_pool_bytes, metavar="SIZE",
                   help="refuse to run unless a device runner's method allocator pool of this size "
                        "(arm_executor_runner: arenas, load_method, inputs) holds the program")
    r.add_argument("--temp-pool", "--temp_pool", type=_pool_bytes, metavar="SIZE",
                   help="refuse to run unless a temp allocator pool of this size serves every instruction")
    _add_limits(r)
    r.set_defaults(func=_cmd_run)
    g = sub.add_parser("generate", help="a decoder LLM (KV cache) as prefill and decode programs; greedy tokens "
                                        "from the .pte files on the host vs the fake-quantized models")
    g.add_argument("-m", "--model_name", "--model-name", default="hf:HuggingFaceTB/SmolLM2-135M",
                   help="a Llama-architecture configuration (random weights), e.g. hf:HuggingFaceTB/SmolLM2-135M")
    g.add_argument("-t", "--target", default="ethos-u85-256", help=f"one of: {', '.join(ALL_TARGETS)}")
    g.add_argument("--layers", type=int, help="build only this many of the model's layers (a quick run)")
    g.add_argument("--prompt-length", "--prompt_length", type=int, default=32, help="prefill tokens (default 32)")
    g.add_argument("--steps", type=int, default=8, help="decode steps after the prompt (default 8)")
    g.add_argument("--max-positions", "--max_positions", type=int,
                   help="KV cache positions (default: prompt length + steps)")
    g.add_argument("--system_config", "--system-config", help="Vela system config (Ethos-U)")
    g.add_argument("--memory_mode", "--memory-mode", help="Vela memory mode (Ethos-U)")
    g.add_argument("--seed", type=int, default=0, help="seed of the random prompt")
    g.add_argument("--kv-cache", "--kv_cache", choices=("in-place", "io"), default="in-place",
                   help="in-place (default): the cache is the program's state, one decoder.pte with methods prefill "
                        "and decode; io: the cache is each call's inputs and outputs, prefill.pte and decode.pte")
    g.add_argument("-o", "--output", help="folder for the programs (default <model>_<target>)")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    _add_limits(g, memory="12G")  # a 135M-parameter decoder's simulation
    g.set_defaults(func=_cmd_generate)
    i = sub.add_parser("inspect", help="describe a .pte: methods, I/O, kernels, delegates, memory")
    i.add_argument("pte")
    i.add_argument("--commands", action="store_true",
                   help="also list each Ethos-U delegate's register command stream, one line per command")
    _add_limits(i)
    i.set_defaults(func=_cmd_inspect)
    a = sub.add_parser("accuracy", help="quantization accuracy of a trained model: float vs fake-quant vs program")
    a.add_argument("-m", "--model_name", "--model-name", default="digits", help="a trained zoo model (digits, waves)")
    a.add_argument("-t", "--target", default="ethos-u55-128")
    a.add_argument("--schemes", default="int8,int8-per-tensor,a16w8",
                   help="comma-separated: int8, int8-per-tensor, int8-histogram, int8-percentile, a16w8")
    a.add_argument("--calibration", default="64", metavar="N|PATH",
                   help="how many training samples to calibrate on (default 64), or calibration data as for compile")
    a.add_argument("--limit", type=int, help="evaluate on at most this many held-out samples")
    a.add_argument("-i", "--intermediates", metavar="DIR", help="write report.html (with per-layer SNR) here")
    a.set_defaults(func=_cmd_accuracy)
    w = sub.add_parser("sweep", help="weight schemes (int8, a16w8, a8w4, 2:4 pruning, clustering) for a model and "
                                     "an Ethos-U target: accuracy, cycles, flash bytes, the Pareto front")
    w.add_argument("-m", "--model_name", "--model-name", required=True,
                   help="a built-in model (digits and waves have held-out data: accuracy; others: SNR against float)")
    w.add_argument("-t", "--target", default="ethos-u55-128", help="an Ethos-U target")
    w.add_argument("--schemes", help="comma-separated: a quantization (int8, a16w8, a8w4, ...), weight transforms "
                        "after '+' (2:4, cluster4, cluster8, cluster16, cluster32), and after '@' the layers it acts "
                        "on (pointwise: 1x1 convolutions and linear layers; the rest stay int8). Default: "
                        "int8, a16w8, a8w4, a8w4@pointwise, int8+2:4, int8+cluster16, int8+cluster8, a8w4+2:4")
    w.add_argument("--calibration", type=int, default=64, help="training samples to calibrate on (default 64)")
    w.add_argument("--limit", type=int, help="held-out samples to evaluate at most")
    w.add_argument("-j", "--jobs", type=int, default=1, help="schemes compiled at a time, in worker processes")
    w.add_argument("--ray", nargs="?", const="", metavar="ADDRESS",
                   help="compile the schemes as tasks of a Ray cluster (pip install 'tosakit[cluster]'; tosakit on "
                        "every node): ADDRESS such as auto or ray://HEAD:10001; alone, the cluster ray.init() finds "
                        "(RAY_ADDRESS) or a local one it starts")
    w.add_argument("--choose", metavar="SCHEME", help="also apply SCHEME layer by layer: keep in int8 the layers it "
                   "hurts most until the loss fits --budget (a model with held-out data); its row is SCHEME~Nint8")
    w.add_argument("--budget", type=float, default=1.0, help="top-1 points --choose may lose against float (1.0)")
    w.add_argument("-i", "--intermediates", help="folder for report.html (table, Pareto plots, per-operation cycles)")
    w.set_defaults(func=_cmd_sweep)
    m = sub.add_parser("models", help="list the built-in models")
    m.set_defaults(func=_cmd_models)
    d = sub.add_parser("demo", help="compile the tutorial's programs and a trained model; verify them on the host")
    d.add_argument("-o", "--output-dir", default="out/demo")
    d.set_defaults(func=_cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line: exit 0, 2 with an ``error:`` line for what the user can fix, 130 on Ctrl-C, 1 (with a
    one-line report) for a tosakit bug."""
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except TosakitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        _quiet_exit("interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`tosakit models | head -1`): nothing left to say
        _quiet_exit()
        return 0
    except MemoryError:
        print("error: out of memory\n  fix: a smaller model or --input-shape, or a machine with more memory",
              file=sys.stderr)
        return EXIT_USER_ERROR
    except Exception:  # a bug in tosakit, not in the user's input
        if os.environ.get("TOSAKIT_DEBUG"):
            traceback.print_exc()
        else:
            exc = sys.exc_info()[1]
            print(f"internal error: {type(exc).__name__}: {first_line(exc)}\n"
                  "  this is a tosakit bug; rerun with TOSAKIT_DEBUG=1 for the traceback and report it",
                  file=sys.stderr)
        return EXIT_INTERNAL_ERROR


def _quiet_exit(message: str | None = None) -> None:
    """Say ``message`` (if stderr is still there), and keep Python from complaining at exit about a stdout
    whose reader has gone."""
    if message:
        try:
            print(message, file=sys.stderr, flush=True)
        except OSError:
            pass
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _on_sigint(signum, frame) -> None:
    """Ctrl-C: KeyboardInterrupt, but never inside an import — raised while a native module initialises it
    crashed the process (numpy: SIGSEGV), and a library's import-time ``except`` swallowed it (the compile
    then finished) — so inside one the signal is sent again 50 ms later."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            again = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))
            again.daemon = True
            again.start()
            return
        frame = frame.f_back
    raise KeyboardInterrupt


def entry() -> None:
    """The ``tosakit`` command. After Ctrl-C the process ends at once with 130: interpreter shutdown could
    otherwise meet the interrupt again in half-imported native modules and die by the signal."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not when Ctrl-C is ignored (a background job)
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        code = main()
    except KeyboardInterrupt:  # between the interpreter's start and main()'s handler
        _quiet_exit("interrupted")
        code = EXIT_INTERRUPTED
    if code == EXIT_INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
