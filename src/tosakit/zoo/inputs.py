"""Example inputs described on the command line (``--input-shape``): a shape, a dtype, and for integers (token
ids, lengths) the range they are drawn from."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import TosakitError

DTYPES = {name: getattr(torch, name) for name in
          ("float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")}
DEFAULT_RANGE = (0, 99)  # integers: within any vocabulary, a valid length or index for most models
MAX_INPUT_BYTES = 1 << 30  # an example input beyond this is a typo, not a model for an embedded NPU
SYNTAX = "SHAPE[:DTYPE[:LOW..HIGH]], e.g. 1,3,224,224 or 1,32:int64:0..30521"


@dataclass(frozen=True)
class InputSpec:
    """One example input: ``shape`` of ``dtype``; integers drawn from ``low..high`` (inclusive), floats normal."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    low: int = DEFAULT_RANGE[0]
    high: int = DEFAULT_RANGE[1]

    @property
    def text(self) -> str:
        return ",".join(map(str, self.shape))

    def make(self) -> torch.Tensor:
        """A tensor of this spec (torch's global generator, as the model's own random weights)."""
        if self.dtype.is_floating_point:
            return torch.randn(*self.shape).to(self.dtype)
        if self.dtype == torch.bool:
            return torch.randint(0, 2, self.shape).bool()
        return torch.randint(self.low, self.high + 1, self.shape, dtype=torch.int64).to(self.dtype)


def parse_input_spec(text: str) -> InputSpec:
    """``SYNTAX`` -> InputSpec; ValueError with the reason for anything else."""
    shape_text, _, rest = text.partition(":")
    dtype_text, _, range_text = rest.partition(":")
    try:
        shape = tuple(int(d) for d in shape_text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise ValueError(f"write dimensions like 1,3,224,224 ({SYNTAX})") from None
    if not shape or any(d <= 0 for d in shape):
        raise ValueError("dimensions must be positive integers")
    dtype = DTYPES.get(dtype_text or "float32")
    if dtype is None:
        raise ValueError(f"unknown dtype {dtype_text!r}: one of {', '.join(DTYPES)}")
    if not range_text:
        return InputSpec(shape, dtype)
    if dtype.is_floating_point or dtype == torch.bool:
        raise ValueError(f"a value range is for integer inputs, not {dtype_text}")
    low, sep, high = range_text.partition("..")
    try:
        low, high = int(low), int(high)
    except ValueError:
        raise ValueError(f"write the range as LOW..HIGH, e.g. 0..30521 ({SYNTAX})") from None
    info = torch.iinfo(dtype)
    if not sep or not info.min <= low <= high <= info.max:
        raise ValueError(f"the range must be LOW..HIGH with {info.min} <= LOW <= HIGH <= {info.max}")
    return InputSpec(shape, dtype, low, high)


def example_inputs(specs: list) -> tuple[torch.Tensor, ...]:
    """One tensor per spec (an InputSpec, or a shape: float32), each at most MAX_INPUT_BYTES."""
    specs = [s if isinstance(s, InputSpec) else InputSpec(tuple(s)) for s in specs]
    for spec in specs:
        size = math.prod(spec.shape) * spec.dtype.itemsize
        if size > MAX_INPUT_BYTES:
            dtype = str(spec.dtype).replace("torch.", "")
            raise TosakitError(f"--input-shape {spec.text} is {size / (1 << 30):.3g} GiB of {dtype}",
                               "give the model's real input shape (at most 1 GiB), e.g. 1,3,224,224")
    return tuple(spec.make() for spec in specs)
