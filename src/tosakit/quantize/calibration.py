"""Calibration: a prepared model run on samples, so its observers see the values it will meet."""

from __future__ import annotations

import sys
from typing import Iterable

import torch
from torch.fx import GraphModule

from ..capture import graph_attr, written_attrs
from ..errors import TosakitError


def calibrate(prepared: GraphModule, samples: Iterable, progress: bool | None = None) -> int:
    """Run ``prepared`` on every sample (a tuple of inputs, a tensor, or a DataLoader batch whose first
    entries are the inputs), with a progress bar on a terminal. Returns how many samples ran."""
    from tqdm import tqdm

    arity = sum(1 for n in prepared.graph.nodes if n.op == "placeholder")
    total = len(samples) if hasattr(samples, "__len__") else None
    show = sys.stderr.isatty() if progress is None else progress
    seen = 0
    state = {name: graph_attr(prepared, name).clone() for name in written_attrs(prepared.graph)}
    with torch.no_grad():
        for sample in tqdm(samples, desc="calibrating", total=total, disable=not show, unit="sample", leave=False):
            inputs = tuple(sample) if isinstance(sample, (tuple, list)) else (sample,)
            prepared(*inputs[:arity])
            seen += 1
        for name, initial in state.items():  # the samples ran in sequence, updating the state; it starts over
            graph_attr(prepared, name).copy_(initial)
    if seen == 0:
        raise TosakitError("calibration got no samples", "pass a non-empty list of input tuples or a DataLoader")
    return seen
