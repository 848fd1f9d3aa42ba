"""Run an Ethos-U delegate payload the way the device does: inputs copied into the scratch arena at the
offsets of the payload's I/O table, the command stream executed, outputs read back from their offsets."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ...backends.ethosu.payload import EthosUPayload
from ...errors import RAISE_MEMORY_HINT, TosakitError
from . import executors  # noqa: F401  (fills the operation table)
from . import weights
from .codec import CODEC
from .commands import CommandStream, NotSimulatedError, decode
from .hardware import ACCELERATORS
from .memory import Memory, Region
from .npu import OPERATIONS, U85_RUNS, Npu, weight_streams
from .profile import NpuProfile, Profiler
from .registers import register_map
from .system import memory_system


@dataclass
class Simulation:
    """The outputs of one run and the NPU operations it executed (command offset, operation)."""

    outputs: list[np.ndarray]
    operations: list[tuple[int, str]] = field(default_factory=list)
    fast_scratch_bytes: int = 0  # the fast scratch the stream addressed: what the platform must lend it
    profile: NpuProfile | None = None  # each operation's estimated time and counters, when asked for


@functools.cache
def _blas() -> "threadpoolctl.ThreadpoolController":  # noqa: F821
    import threadpoolctl

    return threadpoolctl.ThreadpoolController()


def _one_blas_thread():
    """The simulator's products are small: one BLAS thread computes them as fast and leaves the other cores to
    the codec process decoding weights ahead (two BLAS threads beside it made mv2's first run 1.5x slower)."""
    return _blas().limit(limits=1, user_api="blas")


def _io_bytes(t) -> int:
    return int(np.prod(t.shape)) * t.elem_size


# The fast scratch (region 2) is SRAM the platform lends the delegate; a payload does not state its size. The
# simulator counts this much of it up front, and lends more, within the memory limit, to a stream that addresses more.
FAST_SCRATCH_BYTES = 2 << 20


def memory_needed(payload: EthosUPayload) -> int:
    """Bytes the simulator's regions take for ``payload`` at the least (each byte with its written flag)."""
    return 2 * (payload.scratch_size + len(payload.weight_data) + FAST_SCRATCH_BYTES)


def require_simulated(stream: CommandStream) -> CommandStream:
    """``stream``, when the simulator runs everything it sets (all of an Ethos-U55/U65 stream; on the U85 what the
    executors declare, ``npu.U85_RUNS``); NotSimulatedError naming the first command it does not run otherwise."""
    config = stream.accelerator_config
    if config.target.family != "u85":
        return stream
    for c in stream.commands:
        name, reason = c.register.name, None
        if name.startswith("NPU_OP_") and name not in OPERATIONS:
            reason = name
        for f in c.register.fields:
            allowed = U85_RUNS.get((name, f.name))
            shown = f.enum[c.field(f.name)] if f.enum else c.field(f.name)
            if allowed is not None and shown not in allowed:
                reason = f"{name} {f.name} = {shown}"
        if reason:
            raise NotSimulatedError(f"an Ethos-U85 command stream ({config.accelerator}) the simulator does not run "
                                    f"yet: the command at offset {c.offset:#08x} ({reason})",
                                    "run the delegate's TOSA instead (tosakit run --engine tosa)")
    return stream


def simulate(payload: EthosUPayload, inputs: list[np.ndarray], accelerator: str | None = None,
             deadline: float | None = None, max_memory: int = 1 << 31, observe=None,
             profile: list[str] | None = None) -> Simulation:
    """Execute ``payload``'s command stream on ``inputs`` (integer arrays, one per I/O-table input) on
    ``accelerator`` (by default the one the stream's header names), stopping with an error past ``deadline``
    (a ``time.monotonic()`` value); refused before anything is allocated if its regions need more than
    ``max_memory`` bytes. ``observe(npu, command)`` is called after each operation. With ``profile`` (the Vela
    flags the delegate was compiled with: its system config and memory mode), each operation is also timed."""
    stream = require_simulated(decode(payload.cmd_data, accelerator))
    accelerator = stream.accelerator_config.accelerator
    if memory_needed(payload) > max_memory:
        raise TosakitError(f"simulating the Ethos-U delegate needs {memory_needed(payload)} bytes (scratch "
                           f"{payload.scratch_size}, weights {len(payload.weight_data)}, fast scratch "
                           f"{FAST_SCRATCH_BYTES}, each byte with its written flag), more than the {max_memory}-byte "
                           "limit", RAISE_MEMORY_HINT)
    if len(inputs) != len(payload.inputs):
        raise TosakitError(f"the Ethos-U delegate takes {len(payload.inputs)} input(s), {len(inputs)} given",
                           "pass one array per delegate input")
    memory = Memory([Region.of(0, len(payload.weight_data), payload.weight_data, writable=False),
                     Region.of(1, payload.scratch_size),
                     Region.growing(2, (max_memory - memory_needed(payload)) // 2 + FAST_SCRATCH_BYTES)])
    for i, (t, x) in enumerate(zip(payload.inputs, inputs)):
        data = np.ascontiguousarray(x).astype(f"<i{t.elem_size}", copy=False).tobytes()
        if len(data) != _io_bytes(t):
            raise TosakitError(f"input {i} of the Ethos-U delegate has {len(data)} bytes, its I/O table says "
                               f"{_io_bytes(t)} (shape {t.shape}, {t.elem_size}-byte elements)",
                               "pass inputs of the delegate's shape and integer type")
        memory.where = f"input {i}"
        memory.check_span(t.region, t.offset, t.offset + len(data), "is copied to")
        memory.write(t.region, t.offset + np.arange(len(data)), np.frombuffer(data, np.uint8), np.uint8)
    registers = register_map(accelerator)
    npu = Npu(registers, memory, accelerator, (stream.accelerator_config.shram_kib or 0) * 1024)
    ahead = weight_streams(stream.commands, registers, payload.weight_data, 2 * len(payload.weight_data))
    profiler = None if profile is None else Profiler(accelerator, memory_system(profile, ACCELERATORS[accelerator]))
    with _one_blas_thread(), CODEC.ahead([s for s in ahead if not weights.decoded(s)], deadline):
        npu.run(stream.commands, deadline, _both(profiler, observe))
    outputs = []
    for i, t in enumerate(payload.outputs):
        memory.where = f"output {i}"
        raw = np.frombuffer(memory.read_bytes(t.region, t.offset, _io_bytes(t)), np.uint8)
        outputs.append(raw.view(f"<i{t.elem_size}").reshape(t.shape))
    return Simulation(outputs, npu.executed, memory.region(2).used, profiler and profiler.profile)


def _both(first, then):
    """An observer calling ``first`` and then ``then`` (either may be None)."""
    if first is None or then is None:
        return first or then
    return lambda npu, command: (first(npu, command), then(npu, command))
