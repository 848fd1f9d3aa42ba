"""The ``tosakit`` subcommands: each takes the parsed flags, runs what they ask for, and prints it."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from .errors import IndexRangeError, TosakitError, check_writable, write_atomic


def cmd_compile(args) -> int:
    """Compile a model to a .pte; print what runs where, the calibration and the verification."""
    from .compile_job import CompileOptions, compile_model
    from .report import summary

    opts = CompileOptions(
        model_name=args.model_name, target=args.target, delegate=args.delegate, quantize=args.quantize,
        cortex_m_fallback=args.cortex_m_fallback,
        system_config=args.system_config, memory_mode=args.memory_mode, config_ini=args.config_ini,
        extra_flags=args.extra_flags, optimise=args.optimise, arena_cache_size=args.arena_cache_size,
        intermediates=args.intermediates, output=args.output,
        input_shapes=args.input_shape or [], debug_info=args.debug_info, int8_io=args.int8_io,
        channels_last=args.channels_last, verify=args.verify,
        inputs_file=args.inputs, random_inputs=args.random, calibration=args.calibration, quiet=args.quiet,
        bundleio=args.bundleio, external_data=args.external_data,
    )
    start = time.perf_counter()
    run = compile_model(opts)
    print(summary(run.output, run.edge, run.program, time.perf_counter() - start, run.core))
    if run.calibrated_on:
        print(f"calibrated on {run.calibrated_on}")
    if run.verification is not None:
        print(f"verified on {run.verified_on}")
        print(run.verification.table())
    if opts.bundleio:
        from .compile_job import output_step

        bpte, step = run.output.with_suffix(".bpte"), output_step(run)
        print(f"wrote {bpte} (the program and a test case: `tosakit run {bpte}` checks it)")
        if step > 0.01:
            print(f"  its outputs may differ from the fake-quantized model's by one step, {step:.6g}, more than the "
                  f"runners' default tolerance 0.01: check with --atol {step * 1.01:.4g} (ET_ATOL on the device)")
    for path in run.data_files:
        print(f"wrote {path} (the program's named data: `tosakit run {run.output} --data {path}`)")
    if opts.intermediates:
        print(f"reports: {Path(opts.intermediates) / 'report.html'}, report.json"
              + (", layers.csv" if run.verification is not None and run.verification.layers else ""))
    return 0


def cmd_run(args) -> int:
    """Run a .pte on the host; print its outputs (and, with --verify, how the engines agree)."""
    import numpy as np

    from .runtime import load

    if args.verify and args.engine == "tosa":
        raise TosakitError("--verify compares the NPU engine's results with the TOSA ones: it runs --engine npu",
                           "drop --engine tosa")
    tracer = _tracer(args)
    if args.trace:
        check_writable(Path(args.trace), "--trace", args.pte)
    profiled = args.profile or bool(args.trace)
    if profiled and args.verify:
        raise TosakitError("--profile and --trace time one run; --verify runs each delegate twice",
                           "run them one after the other")
    if _is_bundled_file(args.pte):
        if profiled:
            raise TosakitError("--profile and --trace time a .pte's run, not a bundle's test cases",
                               "profile the program itself (its .pte), with --inputs or --random")
        return _run_bundled(args, tracer)
    loading = time.perf_counter_ns()
    # validated whole before torch is imported
    program = load(args.pte, limits=_limits(args), engine=args.engine, data=args.data)
    _traced_load(tracer, program, loading)
    if args.method_pool is not None or args.temp_pool is not None:
        from .runtime.pools import check_pools, runner_memory

        plan = program.plan()
        check_pools(plan, runner_memory(program.program, program.segments, plan, program.named), args.method_pool,
                    args.temp_pool)
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
    for attempt in range(MAX_REDRAWS + 1):
        try:
            if args.verify:
                from .verify.npu_ops import compare_call

                outputs, comparisons, operations = program.run_and_check(inputs, compare_call)
            elif profiled:
                (outputs, steps), comparisons, operations = program.run_profiled(inputs, tracer=tracer), [], []
            else:
                outputs, comparisons, operations = program.run(inputs, tracer=tracer), [], []
            break
        except IndexRangeError as exc:
            culprits = _out_of_range(exc, inputs)
            if not (args.random and culprits) or attempt == MAX_REDRAWS:
                raise _named_index_error(exc, inputs, culprits, args.random) from None
            inputs = _redrawn(inputs, culprits, exc.high, specs, args.seed)
    seconds = time.perf_counter() - start
    for i, out in enumerate(outputs):
        desc = f"output {i}: {str(out.dtype).replace('torch.', '')}{list(out.shape)}"
        if out.numel():
            o = out.double()
            desc += f" min {float(o.min()):.6g} max {float(o.max()):.6g} mean {float(o.mean()):.6g}"
        if out.dim() == 2 and out.shape[-1] > 1 and out.is_floating_point():
            desc += f"; top-5 classes {out[0].topk(min(5, out.shape[-1])).indices.tolist()}"
        print(desc)
    print(f"ran {args.pte} in {seconds:.3f} s" + _engines_line(program.layouts["forward"]))
    for c in comparisons:
        print(f"npu vs tosa: {c}")
    if operations:
        from .verify.npu_ops import summary

        print("\n".join(summary(operations)))
    if profiled:
        _report_profile(program, steps, args)
    if args.outputs:
        # numpy has no bfloat16: such outputs are written widened to float32
        write_outputs(args.outputs, [np.asarray(o.float() if o.dtype == torch.bfloat16 else o) for o in outputs])
        print(f"wrote {args.outputs}")
    _write_trace(tracer, args)
    differ = [c for c in comparisons if not c.bit_exact]
    ops_differ = [r for r in operations if r.differ]
    if differ or ops_differ:
        print(f"the NPU simulator and the TOSA reference model differ on {len(differ)} delegate output(s) and "
              f"{len(ops_differ)} NPU operation(s): report the program to tosakit", file=sys.stderr)
        return 1
    return 0


def _report_profile(program, steps, args) -> None:
    """--profile's table, --trace's file."""
    from .runtime.profile import program_profile

    maps = _operation_maps(program, steps)
    profile = program_profile(program.plan(), steps, labels=_labels(maps))
    if args.profile:
        print("\n".join(profile.lines()))
    if args.trace:
        write_atomic(args.trace, profile.chrome_trace().encode())
        print(f"wrote {args.trace} (a Chrome/Perfetto trace, estimated device time)")


def _operation_maps(program, steps) -> dict:
    """Per simulated delegate that carries its TOSA (compiled with --debug-info): its TOSA and what each NPU
    operation computes, from Vela's operation map of that TOSA (Vela runs again)."""
    from .runtime.ethosu.system import compile_flags
    from .verify.operation_map import operation_map

    layout, maps = program.layouts["forward"], {}
    for index in {s.delegate for s in steps if s.npu is not None}:
        if index in layout.delegate_tosa and index in layout.delegate_npu:
            delegate, tosa = program.plan().delegates[index], layout.delegate_tosa[index][0]
            maps[index] = (tosa, operation_map(tosa, compile_flags(delegate.compile_specs),
                                               layout.delegate_npu[index].cmd_data))
    return maps


def _labels(maps: dict) -> dict[int, dict[int, str]]:
    """Per delegate, what each NPU operation computes ("CONV2D -> tensor"), by its command offset."""
    return {k: {op.offset: f"{op.tosa_op} -> {op.ofm}" for op in m.operations} for k, (_, m) in maps.items()}


def _limits(args):
    """The run limits --max-memory and --timeout give."""
    from .runtime import Limits

    return Limits(max_memory=args.max_memory, timeout=args.timeout)


def cmd_generate(args) -> int:
    """A decoder's prefill and decode programs, written; greedy tokens from them on the host vs the
    fake-quantized models; Vela's cycles per call."""
    import torch

    from .compile_job import Progress
    from .generate import compile_decoder, decoder_scheme, generate
    from .partition import cpu_compute
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
    progress.step(f"compiling {args.model_name} ({c.num_hidden_layers} layers, random weights, {args.scheme}) for "
                  f"{spec.target_name}: "
                  f"prefill {args.prompt_length} tokens and decode 1, KV cache {positions} positions")
    start = time.perf_counter()
    config, modules = decoder_scheme(args.scheme)
    programs = compile_decoder(model, prompt, spec, folder, steps=args.steps, config=config, module_configs=modules)
    for which in ("prefill", "decode"):
        compiled = getattr(programs, which)
        cpu = cpu_compute(compiled.edge.placements)
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


def cmd_inspect(args) -> int:
    """Describe a .pte (and, with --commands, each Ethos-U delegate's command stream)."""
    from .runtime import load
    from .runtime.inspect import command_listing, describe

    from .program import etdump

    if _file_kind(args.pte) == etdump.FILE_IDENTIFIER:
        from .runtime.program import read_file
        from .runtime.trace import event_lines

        print("\n".join(event_lines(etdump.deserialize_etdump(read_file(args.pte, _limits(args), ".etdp")))))
        return 0
    if _is_bundled_file(args.pte):
        from .runtime.bundled import load_bundled, suite_lines

        program, table = load_bundled(args.pte, _limits(args))
        print("\n".join(suite_lines(table)))
    else:
        program = load(args.pte, limits=_limits(args), data=args.data)
    print(describe(program, Path(args.pte).stat().st_size, args.cpu))
    if args.commands:
        print(command_listing(program))
    if args.explore:
        return _explore(program, args)
    return 0


def _explore(program, args) -> int:
    """--explore: one profiled run on seeded random inputs, written as Model Explorer's files, then its server
    on them until Ctrl+C."""
    from .runtime.io import random_inputs
    from .runtime.profile import program_profile
    from .verify.explore import check_explorer, free_port, serve, write_exploration

    check_explorer()
    stem = Path(args.pte).stem
    folder = Path(args.explore_dir or f"{stem}_explore")
    if folder.exists() and not folder.is_dir():
        raise TosakitError(f"--explore-dir {folder} is a file, not a folder", "name a folder for Model Explorer's files")
    inputs = random_inputs([(s.dtype, s.shape) for s in program.input_specs()], seed=0)
    _, steps = program.run_profiled(inputs)
    maps = _operation_maps(program, steps)
    profile = program_profile(program.plan(), steps, args.cpu, _labels(maps))
    exploration = write_exploration(folder, stem, program.plan(), profile, maps)
    print(f"wrote {folder}: the program's graph, {len(exploration.models) - 1} delegate TOSA graph(s), "
          f"{len(exploration.overlays)} overlay(s) (one profiled run on seeded random inputs; times are estimates)")
    host, port = "127.0.0.1", args.port or free_port("127.0.0.1")
    server = serve(host, port)
    signal.signal(signal.SIGTERM, _interrupted)  # stopped by another process: its server stops too
    print(f"Model Explorer: {exploration.url(host, port)}", flush=True)
    print("Ctrl+C stops it", flush=True)
    try:
        return server.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        server.terminate()
        server.wait()


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def _is_bundled_file(path: str) -> bool:
    from .program.bundled import FILE_IDENTIFIER

    return _file_kind(path) == FILE_IDENTIFIER


def _file_kind(path: str) -> bytes:
    """The file identifier of a flatbuffer file (a .pte's, a .bpte's, or a size-prefixed ETDump's); b"" when
    unreadable (load() names what is wrong with the path)."""
    from .program.etdump import FILE_IDENTIFIER, is_etdump

    try:
        with open(path, "rb") as f:
            head = f.read(12)
    except OSError:
        return b""
    return FILE_IDENTIFIER if is_etdump(head) else head[4:8]


def _run_bundled(args, tracer) -> int:
    """Every test case of a .bpte: the outputs against the expected ones, then Test_result (exit 3 on FAIL)."""
    from .runtime.bundled import FAIL_EXIT, check_bundled, load_bundled

    if args.inputs or args.random or args.outputs or args.verify:
        raise TosakitError(f"{args.pte} is a BundledProgram: it runs its own test cases",
                           "drop --inputs/--random/--outputs/--verify, or run the .pte inside it")
    loading = time.perf_counter_ns()
    program, table = load_bundled(args.pte, _limits(args), args.engine)
    _traced_load(tracer, program, loading)
    report = check_bundled(program, table, args.atol, args.rtol, tracer)
    print("\n".join(report.lines()))
    _write_trace(tracer, args)
    return 0 if report.passed else FAIL_EXIT


def _tracer(args):
    """The event tracer --etdump asks for, its files checked writable before any work; else None."""
    if not args.etdump:
        if args.debug_outputs:
            raise TosakitError("--debug-outputs logs the outputs into an ETDump", "add --etdump PATH")
        return None
    from .runtime.trace import EventTracer

    for path in _trace_paths(args):
        check_writable(path, "--etdump", args.pte)
    return EventTracer(args.debug_outputs, args.max_memory)


def _trace_paths(args) -> list[Path]:
    """The ETDump's path, and its debug buffer's with --debug-outputs (beside it: NAME.debug.bin)."""
    path = Path(args.etdump)
    return [path, path.with_suffix(".debug.bin")] if args.debug_outputs else [path]


def _traced_load(tracer, program, start: int) -> None:
    """The load into the tracer's Default block, the first method's memory made inside it (its init)."""
    if tracer is not None:
        from .runtime import execute  # noqa: F401  (imported first: torch's import is not the method's init)

        init = time.perf_counter_ns()
        program.arenas(program.method_names[0])
        end = time.perf_counter_ns()
        tracer.loaded(start, (init, end), end)


def _write_trace(tracer, args) -> None:
    if tracer is not None:
        written = tracer.write(*_trace_paths(args))
        counts = tracer.counts()
        print(f"wrote ETDump {written[0]}: {sum(counts.values())} profile events in {len(tracer.runs)} block(s)"
              + (f"; debug buffer {written[1]} ({len(tracer.debug_buffer)} bytes)" if len(written) > 1 else "")
              + " (ExecuTorch's Inspector reads them; `tosakit inspect` lists them)")


def cmd_accuracy(args) -> int:
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


def cmd_sweep(args) -> int:
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


def cmd_models(args) -> int:
    """List the built-in models and the field's sources."""
    from .zoo import MODELS

    from .zoo.field import HF_MODELS, SOURCES

    width = max(len(n) for n in MODELS)
    for m in MODELS.values():
        print(f"{m.name:<{width}}  {m.description}")
    print(f"\nand the field's own definitions, random weights (the models extra): "
          f"{', '.join(f'{s}:NAME' for s in SOURCES)}; hf: {', '.join(HF_MODELS)}")
    return 0


def cmd_doctor(args) -> int:
    """Say which engines this machine has; exit 0 when every one is ready, 2 otherwise."""
    from .doctor import engines

    found = engines(live=not args.quick)
    for status in found:
        print(status)
    return 0 if all(s.ready for s in found) else 2  # cli.EXIT_USER_ERROR


def cmd_demo(args) -> int:
    """Compile the tutorial's programs and a trained model, and judge each on the host against PyTorch."""
    from .demo import run

    return run(Path(args.output_dir))


MAX_REDRAWS = 4  # --random: times the ids are drawn again in the range the program says it indexes


def _out_of_range(exc: IndexRangeError, inputs: list) -> list[int]:
    """The integer program inputs holding values outside 0..exc.high."""
    import torch

    return [i for i, x in enumerate(inputs) if not x.is_floating_point() and x.dtype != torch.bool and x.numel()
            and (int(x.min()) < 0 or int(x.max()) > exc.high)]


def _redrawn(inputs: list, culprits: list[int], high: int, specs, seed: int) -> list:
    """--random's inputs with the culprits drawn again in 0..high (the program's own range for them)."""
    from .runtime.io import random_inputs

    ranges = [(0, high) if i in culprits else None for i in range(len(inputs))]
    fresh = random_inputs([(s.dtype, s.shape) for s in specs], seed=seed, ranges=ranges)
    print(f"--random: input(s) {', '.join(map(str, culprits))} drawn again in 0..{high}, the rows the program "
          "indexes with them")
    return [fresh[i] if i in culprits else x for i, x in enumerate(inputs)]


def _named_index_error(exc: IndexRangeError, inputs: list, culprits: list[int], drawn: bool) -> TosakitError:
    """An index out of range, blamed on the program inputs that hold values outside 0..high (token ids past the
    vocabulary), when some do; else the program's error as it is."""
    if not culprits:
        return exc
    named = [f"input {i} ({str(inputs[i].dtype).replace('torch.', '')}{list(inputs[i].shape)}: "
             f"{int(inputs[i].min())}..{int(inputs[i].max())})" for i in culprits]
    return TosakitError(f"{', '.join(named)} holds indices outside 0..{exc.high}, which the program indexes with "
                        f"({exc.message})", f"pass values in 0..{exc.high} with --inputs FILE"
                        + (" (--random draws integers from 0..99)" if drawn else ""))


def _engines_line(layout) -> str:
    """Which engine ran the delegates: " (2 Ethos-U delegate(s) on the NPU simulator, ...)", or nothing."""
    parts = [f"{len(layout.delegate_npu)} Ethos-U delegate(s) on the NPU simulator" if layout.delegate_npu else "",
             f"{len(layout.delegate_vgf)} VGF delegate(s) on Arm's ML SDK (vgf engine)" if layout.delegate_vgf else ""]
    tosa = len(layout.delegate_tosa.keys() - layout.delegate_npu.keys() - layout.delegate_vgf.keys())
    parts.append(f"{tosa} delegate(s) on the TOSA reference model" if tosa else "")
    return f" ({', '.join(p for p in parts if p)})" if any(parts) else ""
