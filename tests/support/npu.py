"""The Ethos-U command stream on the host: simulated delegates against the reference model, bit for bit."""

from __future__ import annotations

import numpy as np


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
