"""TOSA run on torch tensors whose graph stores its I/O in other dim orders (NHWC for channels-last I/O): what
every engine of a file's run and the verifier share. Imports torch, numpy and the reference model only, not the
compile flow (``tosakit run`` starts without it)."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .tosa_inprocess import run_tosa


def run_stored(tosa: bytes, tensors: list[torch.Tensor], in_orders, out_orders,
               runner: Callable[[bytes, list[np.ndarray]], list[np.ndarray]] = run_tosa) -> list[torch.Tensor]:
    """Run TOSA whose I/O is stored in the given dim orders (NHWC for channels-last I/O) on torch-layout
    tensors (with ``runner``: in this process by default); the first ``len(out_orders)`` results come back
    in torch layout, the rest as they are."""
    arrays = [t.detach().permute(tuple(o)).contiguous().numpy() for t, o in zip(tensors, in_orders)]
    results = [torch.from_numpy(np.array(r)) for r in runner(tosa, arrays)]
    return [r.permute(tuple(np.argsort(o).tolist())) for r, o in zip(results, out_orders)] + results[len(out_orders):]
