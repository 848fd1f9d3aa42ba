"""Program inputs and outputs as files (.npz) and as seeded random tensors."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import numpy as np
import torch

from ..errors import TosakitError, write_atomic


def read_inputs(path: str | Path, count: int | None = None) -> list[torch.Tensor]:
    """Arrays of an .npz in input order: arg0, arg1, ... when named so, else the file's order."""
    path = Path(path)
    if not path.is_file():
        raise TosakitError(f"inputs file {path} not found", "give an .npz made with numpy.savez(f, arg0=x, ...)")
    try:
        with np.load(path, allow_pickle=False) as data:
            names = list(data.files)
            numbered = sorted(names, key=lambda n: int(n[3:])) if all(re.fullmatch(r"arg\d+", n) for n in names) else names
            arrays = [data[n] for n in numbered]
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise TosakitError(f"cannot read {path} as .npz: {exc}", "save inputs with numpy.savez(path, arg0=x, ...)") from None
    if count is not None and len(arrays) != count:
        raise TosakitError(f"{path} holds {len(arrays)} array(s) ({', '.join(numbered)}), the program takes {count}",
                           "save one array per program input: arg0, arg1, ...")
    return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]


def random_inputs(specs: list[tuple[torch.dtype, tuple[int, ...]]], seed: int = 0,
                  ranges: list[tuple[int, int] | None] | None = None) -> list[torch.Tensor]:
    """Seeded random tensors: normal for floats; integers in ``ranges[i]`` (inclusive) when given, else the full
    range for 8/16-bit integers (quantized data) and 0..99 for wider ones (token ids, positions, lengths: valid
    indices of any vocabulary of 100 or more)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i, (dtype, shape) in enumerate(specs):
        if dtype.is_floating_point:
            out.append(torch.randn(shape, generator=g).to(dtype))
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, generator=g).bool())
        else:
            info = torch.iinfo(dtype)
            lo, hi = (info.min, info.max) if info.bits <= 16 else (0, 99)
            lo, hi = ranges[i] if ranges and ranges[i] is not None else (lo, hi)
            out.append(torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int64).to(dtype))
    return out


def write_outputs(path: str | Path, arrays: list[np.ndarray]) -> None:
    """Outputs as an .npz (out0, out1, ...), written atomically."""
    buf = io.BytesIO()
    np.savez(buf, **{f"out{i}": a for i, a in enumerate(arrays)})
    write_atomic(path, buf.getvalue())
