"""``tosakit inspect``: what a .pte holds — methods, I/O, kernels, delegates, memory."""

from __future__ import annotations

from ..backends.ethosu.payload import parse_payload
from ..program.kernels import kernel_key
from ..program.schema import DelegateCall, KernelCall
from .cpu_cycles import DEFAULT_CORE, cpu_cycles
from .ethosu.commands import decode, disassemble
from .pools import runner_memory
from .program import LoadedProgram
from .validate import MethodLayout, tensor_nbytes


def _kib(n: int) -> str:
    return f"{n} B" if n < 1024 else f"{n / 1024:.1f} KiB"


def state_values(plan) -> list[int]:
    """The values a method writes back at the end of a call (``aten::copy_``'s destination): its state, the
    buffers the model updates, kept from call to call."""
    ops = [i for i, o in enumerate(plan.operators) if (o.name, o.overload) == ("aten::copy_", "")]
    instructions = plan.chains[0].instructions if plan.chains else []
    return list(dict.fromkeys(i.instr_args.args[0] for i in instructions
                              if isinstance(i.instr_args, KernelCall) and i.instr_args.op_index in ops))


def _state_line(plan) -> list[str]:
    state = state_values(plan)
    if not state:
        return []
    tensors = [plan.values[i].val for i in state]
    arenas = sorted({t.allocation_info.memory_id for t in tensors if t.allocation_info is not None})
    shared = " (arena 2: shared with the program's other methods)" if 2 in arenas else ""
    initial = sum(t.data_buffer_idx > 0 for t in tensors)
    start = ("each starts from data in the program" if initial == len(tensors) else "each starts from zeros"
             if not initial else f"{initial} start from data in the program, the others from zeros")
    return [f"  state: {len(state)} buffer(s), {_kib(sum(map(tensor_nbytes, tensors)))}, kept from call to call in "
            f"arena(s) {', '.join(map(str, arenas))}{shared}; {start}"]


def describe(loaded: LoadedProgram, size: int | None = None, core: str = DEFAULT_CORE) -> str:
    """A human-readable summary of every part of the program; its CPU kernels' cycles estimated for ``core``."""
    prog = loaded.program
    lines = [f"{loaded.name}: {'' if size is None else _kib(size) + ', '}program version {prog.version}, "
             f"{len(prog.execution_plan)} method(s), {len(loaded.segments)} segment(s)"]
    constants = prog.constant_segment
    const_bytes = len(loaded.segments[constants.segment_index]) if constants and loaded.segments else 0
    for plan in prog.execution_plan:
        ins = ", ".join(map(str, loaded.input_specs(plan.name)))
        outs = ", ".join(map(str, loaded.output_specs(plan.name)))
        instrs = plan.chains[0].instructions if plan.chains else []
        kernels = sum(isinstance(i.instr_args, KernelCall) for i in instrs)
        calls = sum(isinstance(i.instr_args, DelegateCall) for i in instrs)
        lines += [
            f"method {plan.name}:",
            f"  inputs:  {ins}",
            f"  outputs: {outs}",
            f"  instructions: {len(instrs)} ({kernels} kernel call(s), {calls} delegate call(s))",
            f"  operators: {', '.join(kernel_key(o.name, o.overload) for o in plan.operators) or 'none'}",
            f"  memory: arena(s) {', '.join(_kib(n) for n in plan.non_const_buffer_sizes[1:]) or 'none'}; "
            f"constants {_kib(const_bytes)} ({max(len(constants.offsets) - 1, 0) if constants else 0} tensor(s))",
            *_state_line(plan),
        ]
        lines.append("  runner memory (what a device running ExecuTorch 1.5.1 must provide):")
        lines += [f"    {line}" for line in runner_memory(prog, loaded.segments, plan, loaded.named).lines()]
        for k, d in enumerate(plan.delegates):
            payload = loaded.delegate_payload(d)
            where = "inline" if d.processed.location == 0 else f"segment {d.processed.index}"
            lines.append(f"  delegate {k}: {d.id}, {_kib(len(payload))} ({where})")
            for spec in d.compile_specs:
                lines.append(f"    {spec.key} = {spec.value.decode(errors='replace')}")
            if d.id == "EthosUBackend":
                lines += _ethosu_lines(payload)
            lines.append(f"    TOSA for host runs: {'carried (--debug-info)' if loaded.carries_tosa(d) else 'not carried'}")
            if d.id == "EthosUBackend":
                lines.append(f"    host engine: {_engine(loaded.layouts[plan.name], k)}")
        estimated = cpu_cycles(plan, core)
        if estimated.calls:
            lines += [f"  {line}" for line in estimated.lines()]
    for nd in prog.named_data or []:
        lines.append(f"named data {nd.key}: {_kib(len(loaded.segments[nd.segment_index]))}")
    return "\n".join(lines)


def _engine(layout: MethodLayout, index: int) -> str:
    if index in layout.delegate_npu:
        return "npu (its command stream on the simulator)"
    if index in layout.delegate_tosa:
        return "tosa (its TOSA on the reference model)"
    return "none (a stream the simulator does not run yet, and no TOSA is carried)"


def _ethosu_lines(payload: bytes) -> list[str]:
    p = parse_payload(payload)  # validation has parsed it once already: it reads
    blocks = ", ".join(f"{name} {size}" for name, size in p.blocks)
    io = [f"{kind} {k}: {'x'.join(map(str, t.shape))} x{t.elem_size}B at region {t.region}+{t.offset}"
          for kind, ts in (("in", p.inputs), ("out", p.outputs)) for k, t in enumerate(ts)]
    return [f"    Ethos-U payload blocks: {blocks}",
            f"    scratch: {_kib(p.scratch_size)}; command stream {_kib(len(p.cmd_data))}; weights {_kib(len(p.weight_data))}",
            *(f"    {line}" for line in io)]


def command_listing(loaded: LoadedProgram) -> str:
    """Each Ethos-U delegate's register command stream: a header line, then one line per command, as
    Vela's ``--verbose-register-command-stream`` prints it."""
    lines = []
    for plan in loaded.program.execution_plan:
        for k, d in enumerate(plan.delegates):
            if d.id != "EthosUBackend":
                continue
            stream = decode(parse_payload(loaded.delegate_payload(d)).cmd_data)
            c = stream.accelerator_config
            words = sum(2 if cmd.data is not None else 1 for cmd in stream.commands)
            shram = "" if c.shram_kib is None else f"SHRAM {c.shram_kib} KiB, "
            lines.append(f"method {plan.name}, delegate {k} (EthosUBackend): {c.accelerator} command stream, "
                         f"{len(stream.commands)} commands in {words} words ({shram}"
                         f"architecture {'.'.join(map(str, c.arch_version))})")
            lines += disassemble(stream)
    return "\n".join(lines) if lines else "no Ethos-U delegate: no command stream to list"
