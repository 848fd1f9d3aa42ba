"""The Cortex-M flow's passes: each quantized pattern (dequantize -> op [-> relu/clamp] -> quantize) that a CMSIS-NN
kernel computes becomes one ``cortex_m::`` call with ExecuTorch 1.5.1's integer arguments; the quantize/dequantize
left at the program's edges become ``cortex_m::`` ones. Anything else stays a portable kernel. ``pipeline(isa)``
is the list, in order."""

from __future__ import annotations

import functools
from typing import Callable

from torch.fx import GraphModule

from .elementwise import (add, avg_pool, boundaries, div, extrema, max_pool, mean, mul, passthrough, softmax,
                          table, transpose)
from .layers import batch_matmul, convolution, linear, transposed_convolution
from .patterns import REPLACES

PIPELINE: list[Callable] = [convolution, transposed_convolution, linear, add, mul, div, extrema, batch_matmul,
                            softmax, mean, avg_pool, max_pool, table, passthrough, transpose, boundaries]
__all__ = ["PIPELINE", "REPLACES", "pipeline"]


def pipeline(isa: str) -> list[Callable[[GraphModule], GraphModule]]:
    """The passes for a core whose CMSIS-NN kernels are ``isa``'s (SCALAR, DSP or MVE)."""
    return [functools.partial(p, isa=isa) for p in PIPELINE]
