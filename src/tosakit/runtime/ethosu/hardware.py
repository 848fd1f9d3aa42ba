"""The accelerators as data, for the performance model (``timing``): per configuration its MACs and cores, OFM
microblocks, output and activation cycles per element, and (Ethos-U85) the read buffers of its memory channels.
The figures are Vela 5.2's own (regor's architecture tables), so the model and Vela's estimate read the same."""

from __future__ import annotations

from dataclasses import dataclass

# U85 memory channels, in the order of ``Accelerator.read_buffers``.
CHANNELS = ("mem2mem", "ifm_stream", "weight", "fast_weight", "ifm", "scale")


@dataclass(frozen=True)
class Accelerator:
    """One accelerator configuration's performance figures.

    ``output_cycles``/``activation_cycles``: cycles per OFM element of the output stage, indexed as
    ``timing.output_index``/``activation_index`` choose; ``ublocks``: the OFM microblocks (H, W, C) it computes in
    (U55/U65: the one; U85: those ACC_FORMAT's microblock field picks from, by H x W); ``ifm_ublock``: the IFM's;
    ``read_buffers``: U85's read buffer bytes per memory channel (``CHANNELS``)."""

    name: str
    family: str
    macs: int
    cores: int
    ublocks: tuple[tuple[int, int, int], ...]
    ifm_ublock: tuple[int, int, int]
    output_cycles: tuple[float, ...]
    activation_cycles: tuple[float, ...]
    read_buffers: tuple[int, ...] = ()
    axi_bytes: int = 16  # bytes an AXI beat carries

    @property
    def u85(self) -> bool:
        return self.family == "u85"

    @property
    def burst_cores(self) -> int:
        """Cores whose OFM writes join into one burst (Ethos-U55/U65's; an Ethos-U85 core writes its own)."""
        return 1 if self.u85 else self.cores

    def ublock(self, microblock: str = "") -> tuple[int, int, int]:
        """The OFM microblock: U85's by ACC_FORMAT's microblock name (``MICROBLOCK_U2X2``), else the one."""
        if self.u85 and microblock:
            h, w = (int(v) for v in microblock.rsplit("_U", 1)[1].split("X"))
            return next((u for u in self.ublocks if u[:2] == (h, w)), (h, w, self.ublocks[0][2]))
        return self.ublocks[0]


def _u55(name, macs, cores, ublock, output, activation) -> Accelerator:
    return Accelerator(name, name[6:9], macs, cores, (ublock,), ublock if macs > 32 else (1, 1, 8), output,
                       activation, axi_bytes=8 if name.startswith("ethos-u55") else 16)


# Output cycles (U55/U65): 0 unary elementwise on 32-bit IFMs, 1 binary on 32-bit, 2 MUL to 32 bits, 3 MUL or a
# 40-bit accumulator, 4 simple ADD/SUB (unused), 5 ADD/SUB, 6 MAX pooling, 7 the rest. Activation: 0 LUT functions
# (TANH, SIGMOID, TABLE_n), 1 the RELU family, 2 none.
_U55 = (
    _u55("ethos-u55-32", 32, 1, (1, 1, 4), (2.0, 3.0, 3.0, 3.0, 4.0, 6.0, 1.0, 2.0), (1.0, 1.0, 0.0)),
    _u55("ethos-u55-64", 64, 1, (1, 1, 8), (1.0, 1.5, 1.5, 1.5, 2.0, 3.0, 0.5, 1.0), (1.0, 1.0, 0.0)),
    _u55("ethos-u55-128", 128, 1, (1, 2, 8), (0.75, 1.25, 0.75, 0.75, 1.0, 1.5, 0.25, 0.5), (1.0, 0.5, 0.0)),
    _u55("ethos-u55-256", 256, 1, (2, 2, 8), (0.625, 1.125, 0.5, 0.375, 0.5, 0.75, 0.125, 0.25), (1.0, 0.25, 0.0)),
    _u55("ethos-u65-256", 256, 1, (2, 2, 8), (0.625, 1.125, 0.5, 0.375, 0.5, 0.75, 0.125, 0.25), (1.0, 0.25, 0.0)),
    _u55("ethos-u65-512", 256, 2, (2, 2, 8), (0.3125, 0.5625, 0.25, 0.1875, 0.25, 0.375, 0.0625, 0.125),
         (0.5, 0.125, 0.0)),
)


def _u85(macs, ublocks, ifm_ublock, output, activation, read_buffers) -> Accelerator:
    cores = {128: 1, 256: 1, 512: 2}.get(macs, 4)
    return Accelerator(f"ethos-u85-{macs}", "u85", macs, cores, ublocks, ifm_ublock, output, activation,
                       read_buffers)


# Output cycles (U85): 0 8-bit OFM, 1 16-bit, 2 32-bit, 3 64-bit, 4 a chain buffer written with 32-bit data or a
# binary elementwise on 32-bit IFMs to a narrower OFM, 5 that to a 32-bit OFM. Activation: 0 plain, 1 transposing
# H and W, or reversing W.
_U85 = (
    _u85(128, ((1, 2, 8), (1, 1, 16)), (1, 2, 8), (0.5, 0.5, 0.5, 1.0, 1.0, 1.0), (0.5, 1.0),
         (64, 64, 128, 128, 104, 16)),
    _u85(256, ((1, 2, 16), (1, 4, 8), (2, 2, 8)), (2, 2, 8), (0.25, 0.25, 0.25, 0.5, 0.5, 0.5), (0.25, 0.5),
         (104, 104, 128, 128, 128, 16)),
    _u85(512, ((2, 2, 16), (1, 4, 16)), (2, 2, 16), (0.125, 0.125, 0.25, 0.5, 0.25, 0.25), (0.125, 0.25),
         (128, 128, 256, 256, 128, 16)),
    _u85(1024, ((2, 2, 32), (1, 4, 32), (2, 4, 16)), (4, 2, 16), (0.0625, 0.125, 0.25, 0.5, 0.125, 0.25),
         (0.0625, 0.125), (256, 256, 416, 208, 256, 16)),
    _u85(2048, ((2, 2, 64), (1, 4, 64), (4, 4, 16)), (4, 4, 16), (0.03125, 0.0625, 0.125, 0.25, 0.0625, 0.125),
         (0.03125, 0.0625), (256, 256, 512, 256, 256, 16)),
)

ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in (*_U55, *_U85)}
U85_DIV_CYCLES = 33.0  # an Ethos-U85 DIV: cycles per element, every configuration
