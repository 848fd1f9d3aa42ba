"""The ``tosakit`` command: its flags (``build_parser``), exit codes and Ctrl-C handling; the subcommands
themselves are in ``cli_commands``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback

from .cli_commands import (cmd_accuracy, cmd_compile, cmd_demo, cmd_doctor, cmd_generate, cmd_inspect, cmd_models,
                           cmd_run, cmd_sweep)
from .errors import TosakitError, first_line
from .targets import ALL_TARGETS, CORTEX_M_ISA

DECODER_SCHEMES = ("int8", "a8w4", "a8w4-head8", "a16w8")  # generate --scheme: generate.DECODER_SCHEMES

EXIT_USER_ERROR = 2
EXIT_INTERNAL_ERROR = 1
EXIT_INTERRUPTED = 130


def _shape(text: str):
    """An --input-shape: zoo.inputs' SYNTAX."""
    from .zoo.inputs import parse_input_spec

    try:
        return parse_input_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--input-shape {text!r}: {exc}") from None


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


def _add_vela_system(p) -> None:
    p.add_argument("--system_config", "--system-config", help="Vela system config (Ethos-U)")
    p.add_argument("--memory_mode", "--memory-mode", help="Vela memory mode (Ethos-U)")


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand's flags."""
    parser = argparse.ArgumentParser(prog="tosakit", description="PyTorch to Arm Ethos-U / VGF via TOSA, as .pte")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compile", help="compile a model to a .pte (like ExecuTorch's aot_arm_compiler)")
    c.add_argument("-m", "--model_name", "--model-name", required=True,
                   help="zoo name (see `tosakit models`) or path/file.py:ClassOrFactory")
    c.add_argument("-t", "--target", default="ethos-u55-128", help=f"one of: {', '.join(ALL_TARGETS)}")
    c.add_argument("--delegate", action="store_true", help="delegate what the target runs (else: CPU only)")
    c.add_argument("--cortex-m-fallback", "--cortex_m_fallback", metavar="CORE",
                   help="run the quantized layers the delegate leaves on the CPU as this Cortex-M core's cortex_m:: "
                        "kernels (CMSIS-NN), e.g. cortex-m55 beside an Ethos-U55 on Corstone-300")
    c.add_argument("--cortex-m55-fallback", dest="cortex_m_fallback", action="store_const", const="cortex-m55",
                   help="--cortex-m-fallback cortex-m55")
    c.add_argument("--quantize", action="store_true",
                   help="int8 post-training quantization, calibrated on --calibration data (else the example input; "
                        "a trained built-in model: its training data)")
    c.add_argument("--calibration", metavar="PATH",
                   help="calibration samples for --quantize: an .npz (arg0, ... shaped [N, ...] for N samples), .npy, "
                        ".pt, or a folder of such files")
    _add_vela_system(c)
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
                   help="example input for a model file without example inputs (repeat per input): SHAPE, or "
                        "SHAPE:DTYPE, or SHAPE:DTYPE:LOW..HIGH for integers (token ids: 1,32:int64:0..30521; "
                        "integers default to 0..99)")
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
    c.add_argument("--external-data", action="store_true",
                   help="write the CPU kernels' constants and each Ethos-U delegate's command stream and weights to "
                        "NAME.ptd (ExecuTorch's named data), the .pte naming them by key (`tosakit run X.pte --data "
                        "X.ptd`; ExecuTorch: load_program(pte, data_path=ptd))")
    c.add_argument("--bundleio", action="store_true",
                   help="also write NAME.bpte: the program bundled with a test case (the --inputs, or the example "
                        "input) and the outputs expected (the fake-quantized model's with --quantize, else the float "
                        "model's), which `tosakit run NAME.bpte` and ExecuTorch's runners check")
    c.add_argument("--inputs", help="inputs for --verify: an .npz with arrays arg0, arg1, ... (default: the example "
                                    "input, or seeded random inputs when it was the calibration sample)")
    c.add_argument("--random", action="store_true", help="seeded random inputs for --verify")
    c.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    c.set_defaults(func=cmd_compile)
    r = sub.add_parser("run", help="run a .pte on the host (CPU ops in PyTorch, Ethos-U delegates on the "
                                   "command-stream simulator, VGF delegates on Arm's ML SDK, TOSA delegates on the "
                                   "TOSA reference model)")
    r.add_argument("pte")
    r.add_argument("--engine", choices=("npu", "tosa", "vgf"),  # runtime.validate.ENGINES (not imported: slow)
                   help="how delegates run: npu, Ethos-U command streams on the simulator (Ethos-U55, U65, U85); "
                        "vgf, VGF payloads on Arm's ML SDK (emulation layer over Mesa's software Vulkan); tosa, the "
                        "TOSA they carry (--debug-info) on the reference model (default: npu for the streams the "
                        "simulator runs, vgf when this machine has the stack (`tosakit doctor`), else tosa)")
    r.add_argument("--verify", action="store_true",
                   help="also run each delegate the npu or vgf engine runs from its carried TOSA on the same inputs "
                        "and compare, per delegate output (exit 1 if they differ)")
    r.add_argument("--inputs", help=".npz with arrays arg0, arg1, ... (or in file order)")
    r.add_argument("--random", action="store_true", help="seeded random inputs of the program's shapes")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--outputs", help="write the outputs to this .npz (out0, out1, ...)")
    r.add_argument("--method-pool", "--method_pool", type=_pool_bytes, metavar="SIZE",
                   help="refuse to run unless a device runner's method allocator pool of this size "
                        "(arm_executor_runner: arenas, load_method, inputs) holds the program")
    r.add_argument("--temp-pool", "--temp_pool", type=_pool_bytes, metavar="SIZE",
                   help="refuse to run unless a temp allocator pool of this size serves every instruction")
    r.add_argument("--data", metavar="PTD",
                   help="the program's named-data file (.ptd): its external constants and delegate blocks")
    r.add_argument("--etdump", metavar="PATH",
                   help="write an ETDump of the run (ExecuTorch's format: an event per kernel and delegate call, host "
                        "times; ExecuTorch's Inspector and `tosakit inspect` read it)")
    r.add_argument("--debug-outputs", action="store_true",
                   help="with --etdump: also log each kernel's output and each delegate call's tensors (their bytes "
                        "in PATH's .debug.bin, Inspector's debug_buffer_path)")
    r.add_argument("--profile", action="store_true",
                   help="print where the time goes, estimated on the device: a timeline of the CPU kernels "
                        "(Cortex-M cycle estimates) and of each NPU operation of the Ethos-U command streams (the "
                        "simulator's performance model), the top consumers, totals and the NPU's counters")
    r.add_argument("--trace", metavar="PATH",
                   help="write that timeline as a Chrome/Perfetto trace (JSON; open it in ui.perfetto.dev or "
                        "chrome://tracing): each CPU kernel and NPU operation an event, cycles and counters in args")
    r.add_argument("--atol", type=float, default=0.01, help="a .bpte's absolute tolerance (default 0.01)")
    r.add_argument("--rtol", type=float, default=0.01, help="a .bpte's relative tolerance (default 0.01)")
    _add_limits(r)
    r.set_defaults(func=cmd_run)
    g = sub.add_parser("generate", help="a decoder LLM (KV cache) as prefill and decode programs; greedy tokens "
                                        "from the .pte files on the host vs the fake-quantized models")
    g.add_argument("-m", "--model_name", "--model-name", default="hf:HuggingFaceTB/SmolLM2-135M",
                   help="a Llama-architecture configuration (random weights), e.g. hf:HuggingFaceTB/SmolLM2-135M")
    g.add_argument("-t", "--target", default="ethos-u85-256", help=f"one of: {', '.join(ALL_TARGETS)}")
    g.add_argument("--layers", type=int, help="build only this many of the model's layers (a quick run)")
    g.add_argument("--prompt-length", "--prompt_length", type=int, default=32, help="prefill tokens (default 32)")
    g.add_argument("--steps", type=int, default=8, help="decode steps after the prompt (default 8)")
    g.add_argument("--scheme", choices=DECODER_SCHEMES, default="int8",
                   help="the weights: int8 (default), a8w4 (4-bit weights: half the bytes the decode streams), "
                        "a8w4-head8 (4-bit but the lm_head, the tied embedding, in int8), a16w8 (16-bit "
                        "activations)")
    g.add_argument("--max-positions", "--max_positions", type=int,
                   help="KV cache positions (default: prompt length + steps)")
    _add_vela_system(g)
    g.add_argument("--seed", type=int, default=0, help="seed of the random prompt")
    g.add_argument("--kv-cache", "--kv_cache", choices=("in-place", "io"), default="in-place",
                   help="in-place (default): the cache is the program's state, one decoder.pte with methods prefill "
                        "and decode; io: the cache is each call's inputs and outputs, prefill.pte and decode.pte")
    g.add_argument("-o", "--output", help="folder for the programs (default <model>_<target>)")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    _add_limits(g, memory="12G")  # a 135M-parameter decoder's simulation
    g.set_defaults(func=cmd_generate)
    i = sub.add_parser("inspect", help="describe a .pte: methods, I/O, kernels, delegates, memory")
    i.add_argument("pte")
    i.add_argument("--data", metavar="PTD",
                   help="the program's named-data file (.ptd): its external constants and delegate blocks")
    i.add_argument("--commands", action="store_true",
                   help="also list each Ethos-U delegate's register command stream, one line per command")
    i.add_argument("--cpu", default="cortex-m55", choices=list(CORTEX_M_ISA), metavar="CORE",
                   help="the Cortex-M core the CPU kernels' cycles are estimated for (default cortex-m55): "
                        + ", ".join(CORTEX_M_ISA))
    i.add_argument("--explore", action="store_true",
                   help="open the program in Google's Model Explorer (its graph, each Ethos-U delegate's TOSA through "
                        "Arm's adapter) with placement, estimated time and the NPU's counters per node, from one "
                        "profiled run on seeded random inputs; serves until Ctrl+C")
    i.add_argument("--explore-dir", metavar="DIR",
                   help="where --explore writes the files Model Explorer reads (default <program>_explore)")
    i.add_argument("--port", type=int, help="--explore's server port on 127.0.0.1 (default: a free one)")
    _add_limits(i)
    i.set_defaults(func=cmd_inspect)
    a = sub.add_parser("accuracy", help="quantization accuracy of a trained model: float vs fake-quant vs program")
    a.add_argument("-m", "--model_name", "--model-name", default="digits", help="a trained zoo model (digits, waves)")
    a.add_argument("-t", "--target", default="ethos-u55-128")
    a.add_argument("--schemes", default="int8,int8-per-tensor,a16w8",
                   help="comma-separated: int8, int8-per-tensor, int8-histogram, int8-percentile, a16w8")
    a.add_argument("--calibration", default="64", metavar="N|PATH",
                   help="how many training samples to calibrate on (default 64), or calibration data as for compile")
    a.add_argument("--limit", type=int, help="evaluate on at most this many held-out samples")
    a.add_argument("-i", "--intermediates", metavar="DIR", help="write report.html (with per-layer SNR) here")
    a.set_defaults(func=cmd_accuracy)
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
    w.set_defaults(func=cmd_sweep)
    m = sub.add_parser("models", help="list the built-in models")
    m.set_defaults(func=cmd_models)
    e = sub.add_parser("doctor", help="which engines this machine has to run programs (npu, tosa, vgf), and how "
                                      "to add a missing one")
    e.add_argument("--quick", action="store_true", help="check the VGF stack's parts without running a graph")
    e.set_defaults(func=cmd_doctor)
    d = sub.add_parser("demo", help="compile the tutorial's programs and a trained model; verify them on the host")
    d.add_argument("-o", "--output-dir", default="out/demo")
    d.set_defaults(func=cmd_demo)
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
