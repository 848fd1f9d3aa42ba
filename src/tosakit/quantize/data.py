"""Calibration data from files: what ``--calibration PATH`` reads.

A sample is one tuple of input tensors shaped like the model's example inputs. A file holds one sample or
many: an array shaped like input i is one sample; one with a leading axis of N samples is N (and when the
example input has a batch of 1, ``[N, *rest]`` is read as N single-batch samples).

- ``.npz``: one array per model input (``arg0``, ``arg1``, ... or in file order), all with the same N;
- ``.npy``: the samples of a single-input model;
- ``.pt``/``.pth`` (read with ``torch.load(weights_only=True)``): a tensor (single input), a list of
  tensors or of tuples (one per sample), or a dict ``{"arg0": ..., ...}``;
- a folder: every such file in it, in name order.
"""

from __future__ import annotations

import pickle
import re
import zipfile
from pathlib import Path

import numpy as np
import torch

from ..errors import TosakitError

SUFFIXES = (".npz", ".npy", ".pt", ".pth")
FIX = ("save one array per model input: numpy.savez('calib.npz', arg0=x) with x shaped [N, ...] for N samples, "
       "or a folder of such files")


def read_calibration(path: str | Path, example: tuple) -> list[tuple]:
    """The samples in ``path`` (a file or a folder of files), each a tuple shaped like ``example``."""
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in SUFFIXES and p.is_file())
        if not files:
            raise TosakitError(f"calibration folder {path} has no {'/'.join(SUFFIXES)} files", FIX)
        samples = [s for f in files for s in _read_file(f, example)]
    elif path.is_file():
        samples = _read_file(path, example)
    else:
        raise TosakitError(f"calibration data {path} not found", "give an .npz/.npy/.pt file or a folder of them")
    if not samples:
        raise TosakitError(f"calibration data {path} holds no samples", FIX)
    return samples


def _read_file(path: Path, example: tuple) -> list[tuple]:
    if path.suffix not in SUFFIXES:
        raise TosakitError(f"calibration file {path}: unknown kind {path.suffix or '(no suffix)'}",
                           f"use {', '.join(SUFFIXES)}")
    try:
        arrays = _load(path)
    except (ValueError, OSError, EOFError, RuntimeError, zipfile.BadZipFile, pickle.UnpicklingError) as exc:
        raise TosakitError(f"cannot read calibration file {path}: {type(exc).__name__}: {str(exc).splitlines()[0]}",
                           FIX) from None
    if isinstance(arrays, list) and arrays and isinstance(arrays[0], tuple):  # already one tuple per sample
        return [_sample(path, s, example, k) for k, s in enumerate(arrays)]
    if len(arrays) != len(example):
        raise TosakitError(f"calibration file {path} holds {len(arrays)} array(s); the model takes {len(example)} "
                           "input(s)", FIX)
    per_input = [_split(path, a, e, i) for i, (a, e) in enumerate(zip(arrays, example))]
    counts = {len(p) for p in per_input}
    if len(counts) != 1:
        raise TosakitError(f"calibration file {path}: the inputs hold different sample counts "
                           f"({', '.join(str(len(p)) for p in per_input)})", "give every input the same N samples")
    return list(zip(*per_input))


def _load(path: Path) -> list:
    """The file's arrays in input order, or a list of per-sample tuples."""
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as data:
            names = list(data.files)
            if all(re.fullmatch(r"arg\d+", n) for n in names):
                names.sort(key=lambda n: int(n[3:]))
            return [torch.from_numpy(np.ascontiguousarray(data[n])) for n in names]
    if path.suffix == ".npy":
        return [torch.from_numpy(np.ascontiguousarray(np.load(path, allow_pickle=False)))]
    obj = torch.load(path, weights_only=True, map_location="cpu")
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        names = list(obj)
        if all(isinstance(n, str) and re.fullmatch(r"arg\d+", n) for n in names):
            names.sort(key=lambda n: int(n[3:]))
        return [obj[n] for n in names]
    if isinstance(obj, (list, tuple)) and obj:
        return [tuple(s) if isinstance(s, (list, tuple)) else (s,) for s in obj]
    raise TosakitError(f"calibration file {path} holds a {type(obj).__name__}",
                       "save a tensor, a list of tensors (or of input tuples), or a dict {'arg0': tensor}")


def _split(path: Path, array, example: torch.Tensor, index: int) -> list[torch.Tensor]:
    """One input's array as samples shaped like ``example``."""
    a = _tensor(path, array, example, index)
    shape = tuple(example.shape)
    if tuple(a.shape) == shape:
        return [a]
    if a.dim() == len(shape) + 1 and tuple(a.shape[1:]) == shape:
        return list(a)
    if shape and shape[0] == 1 and a.dim() == len(shape) and tuple(a.shape[1:]) == shape[1:]:
        return [s[None] for s in a]
    want = "x".join(map(str, shape))
    raise TosakitError(f"calibration file {path}: input {index} is {'x'.join(map(str, a.shape))}, the model takes "
                       f"{want}", f"give input {index} shaped {want} or [N, {', '.join(map(str, shape))}]")


def _sample(path: Path, sample: tuple, example: tuple, k: int) -> tuple:
    if len(sample) != len(example):
        raise TosakitError(f"calibration file {path}: sample {k} has {len(sample)} input(s), the model takes "
                           f"{len(example)}", FIX)
    out = []
    for i, (a, e) in enumerate(zip(sample, example)):
        t = _tensor(path, a, e, i)
        if t.shape != e.shape:
            if e.dim() and e.shape[0] == 1 and t.shape == e.shape[1:]:
                t = t[None]
            else:
                raise TosakitError(f"calibration file {path}: sample {k} input {i} is {'x'.join(map(str, t.shape))}, "
                                   f"the model takes {'x'.join(map(str, e.shape))}", FIX)
        out.append(t)
    return tuple(out)


def _tensor(path: Path, a, example: torch.Tensor, index: int) -> torch.Tensor:
    """``a`` as a tensor of the example input's dtype (floats may widen or narrow; kinds must agree)."""
    t = a if isinstance(a, torch.Tensor) else torch.as_tensor(np.asarray(a))
    if t.is_floating_point() != example.is_floating_point() or (t.dtype == torch.bool) != (example.dtype == torch.bool):
        raise TosakitError(f"calibration file {path}: input {index} holds {str(t.dtype).replace('torch.', '')}, the "
                           f"model takes {str(example.dtype).replace('torch.', '')}",
                           f"save input {index} as {str(example.dtype).replace('torch.', '')}")
    return t.to(example.dtype).contiguous()
