"""The Ethos-U command stream on the host: simulated delegates against the reference model, bit for bit."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


def npu_inputs(payload, seed: int, tosa: bytes | None = None) -> list[np.ndarray]:
    """Seeded integers over each delegate input's whole range (int32 inputs within +-2**16: the reference
    model calls an int32 sum that leaves int32 unpredictable); an input ``tosa`` reads as GATHER/SCATTER indices
    holds distinct rows in range (SCATTER writes each row once)."""
    from tosakit.runtime.tosa_inprocess import index_bounds

    rng = np.random.default_rng(seed)
    bounds = index_bounds(tosa) if tosa is not None else {}
    out = []
    for k, t in enumerate(payload.inputs):
        if k in bounds:
            size, rows = int(np.prod(t.shape)), bounds[k]
            picks = rng.choice(rows, size, replace=False) if size <= rows else rng.integers(0, rows, size)
            out.append(picks.reshape(t.shape).astype(f"i{t.elem_size}"))
            continue
        info = np.iinfo(f"i{t.elem_size}")
        lo, hi = (-(1 << 16), 1 << 16) if t.elem_size == 4 else (info.min, info.max)
        out.append(rng.integers(lo, hi, size=t.shape, endpoint=True).astype(f"i{t.elem_size}"))
    return out


def assert_npu_bit_exact(tosa: bytes, payload, seeds=(0, 1)) -> None:
    """The simulated command stream's outputs equal the reference model's on the TOSA Vela compiled, bit for
    bit, for seeded inputs over the whole integer range."""
    from tosakit.runtime.ethosu.simulate import simulate
    from tosakit.runtime.tosa_inprocess import run_tosa
    from tosakit.runtime.tosa_validate import check_tosa

    shapes = [t.shape for t in check_tosa(tosa, "delegate", 1 << 31).inputs]
    for seed in seeds:
        xs = npu_inputs(payload, seed, tosa)
        want = run_tosa(tosa, [x.reshape(shape) for x, shape in zip(xs, shapes)])
        got = simulate(payload, xs).outputs
        assert len(got) == len(want)
        for k, (g, w) in enumerate(zip(got, want)):
            g, w = g.reshape(-1).astype(np.int64), np.asarray(w).reshape(-1).astype(np.int64)
            diff = np.flatnonzero(g != w)
            assert g.size == w.size, f"output {k}: {g.size} values simulated, {w.size} from the reference model"
            assert diff.size == 0, (
                f"seed {seed}, output {k}: {diff.size} of {w.size} values differ, first at {diff[0]}: "
                f"simulated {g[diff[0]]}, reference {w[diff[0]]}")


def assert_u85_bit_exact(found, seeds=(0,)) -> str:
    """Each Ethos-U85 delegate in ``found`` run by the simulator (nothing refused) bit for bit; their listings,
    joined."""
    from tosakit.runtime.ethosu.commands import decode, disassemble
    from tosakit.runtime.ethosu.simulate import require_simulated

    listings = []
    for tosa, payload in found:
        stream = require_simulated(decode(payload.cmd_data))
        assert_npu_bit_exact(tosa, payload, seeds=seeds)
        listings += disassemble(stream)
    return "\n".join(listings)


# Op-table cases whose simulated Ethos-U55 stream differs from the TOSA reference model, with why. Each is
# pinned: its test asserts the difference, so a change on either side is seen. (README, "Ethos-U simulator")
NPU_DIFFERENCES = {
    "upsample_nearest_4x2": "Vela 5.2 legalises a (4, 2) nearest upsample as two IFM_UPSCALE NEAREST passes; "
                            "NEAREST doubles height and width alike, so input columns repeat 4x, not 2x",
}


def ethosu_blobs(compiled) -> list[tuple[bytes, bytes]]:
    """(TOSA, payload bytes) of each Ethos-U delegate of a compiled program."""
    from tosakit.program import LoweredBackendModule

    return [(m.tosa, m.processed_bytes) for m in compiled.edge.program.graph_module.children()
            if isinstance(m, LoweredBackendModule) and m.backend_id == "EthosUBackend"]


def ethosu_delegates(compiled) -> list[tuple[bytes, object]]:
    """(TOSA, parsed payload) of each Ethos-U delegate of a compiled program."""
    from tosakit.backends.ethosu.payload import parse_payload

    return [(tosa, parse_payload(payload)) for tosa, payload in ethosu_blobs(compiled)]


def assert_counters_exact(edge) -> int:
    """Each Ethos-U delegate of ``edge`` simulated with timing on: every operation's beat counters are its bytes
    moved, counted here apart from the simulator's own tally (every read and write of its memory, per region),
    put on the AXI port Vela's own vela.ini gives the region's area in the delegate's memory mode, in beats of the
    accelerator's bus width. The number of operations checked."""
    import configparser
    from pathlib import Path

    import ethosu.vela

    from tosakit.backends.ethosu.payload import parse_payload
    from tosakit.runtime.ethosu import memory as M
    from tosakit.runtime.ethosu.profile import NpuOp
    from tosakit.runtime.ethosu.simulate import simulate
    from tosakit.runtime.ethosu.system import compile_flags

    ini = configparser.ConfigParser()
    ini.read(Path(ethosu.vela.__file__).parents[1] / "config_files" / "Arm" / "vela.ini")
    tally: dict[tuple[int, str], int] = {}
    read, write = M.Memory.read, M.Memory.write

    def counted_read(self, index, addresses, dtype):
        tally[index, "read"] = tally.get((index, "read"), 0) + np.asarray(addresses).size * np.dtype(dtype).itemsize
        return read(self, index, addresses, dtype)

    def counted_write(self, index, addresses, values, dtype):
        tally[index, "write"] = tally.get((index, "write"), 0) + np.asarray(addresses).size * np.dtype(dtype).itemsize
        return write(self, index, addresses, values, dtype)

    checked = 0
    for module in [m for m in edge.program.graph_module.children() if getattr(m, "backend_id", "") == "EthosUBackend"]:
        payload, flags = parse_payload(module.processed_bytes), compile_flags(module.compile_specs)
        options = dict(f.removeprefix("--").split("=", 1) for f in flags if "=" in f)
        mode = f"Memory_Mode.{options['memory-mode']}"
        while not ini.has_option(mode, "const_mem_area"):
            mode = ini.get(mode, "inherit")
        port = {r: int(ini.get(mode, f"{area}_mem_area")[-1]) for r, area in enumerate(("const", "arena", "cache"))}
        u85 = options["accelerator-config"].startswith("ethos-u85")
        beat = 8 if options["accelerator-config"].startswith("ethos-u55") else 16
        names = {(0, "read"): 1, (0, "write"): 0, (1, "read"): 3, (1, "write"): 2} if u85 else \
            {(0, "read"): 0, (1, "read"): 1, (0, "write"): 2, (1, "write"): 3}
        per_op: list[dict] = []

        def observe(npu, command):
            if command.register.name not in ("NPU_OP_DMA_WAIT", "NPU_OP_KERNEL_WAIT", "NPU_OP_STOP", "NPU_OP_IRQ",
                                             "NPU_OP_PMU_MASK"):
                per_op.append(dict(tally))

        inputs = npu_inputs(payload, 0, module.tosa)
        tally.clear()
        M.Memory.read, M.Memory.write = counted_read, counted_write
        try:
            profile = simulate(payload, inputs, profile=flags, observe=observe).profile
        finally:
            M.Memory.read, M.Memory.write = read, write
        assert len(per_op) == len(profile.operations)
        previous: dict = {}  # before the first operation: the inputs copied in
        for t in payload.inputs:
            previous[t.region, "write"] = previous.get((t.region, "write"), 0) + int(np.prod(t.shape)) * t.elem_size
        for k, (op, seen) in enumerate(zip(profile.operations, per_op)):
            assert isinstance(op, NpuOp)
            moved: dict[tuple[int, str], int] = {}
            for (region, way), n in seen.items():
                delta = n - previous.get((region, way), 0)
                if delta:
                    moved[port[region], way] = moved.get((port[region], way), 0) + delta
            previous = seen
            events = ("SRAM_WR_DATA_BEAT_WRITTEN", "SRAM_RD_DATA_BEAT_RECEIVED", "EXT_WR_DATA_BEAT_WRITTEN",
                      "EXT_RD_DATA_BEAT_RECEIVED") if u85 else (
                "AXI0_RD_DATA_BEAT_RECEIVED", "AXI1_RD_DATA_BEAT_RECEIVED", "AXI0_WR_DATA_BEAT_WRITTEN",
                "AXI1_WR_DATA_BEAT_WRITTEN")
            want = {events[names[key]]: -(-n // beat) for key, n in moved.items()}
            got = {name: v for name, v in op.counters.items() if name in events and v}
            assert got == want, f"operation {k} ({op.operation} at {op.offset:#x}): counters {got}, bytes moved {want}"
            checked += 1
    return checked


class NpuWorkNet(nn.Module):
    """Convolution, depthwise, pooling, a residual add, a fully connected layer: each kind of NPU work (the boundary
    quantize/dequantize stay on the CPU)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 16, 3, padding=1)
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = y + self.dw(y)
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1))
