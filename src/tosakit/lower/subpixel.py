"""A stride-s transposed convolution as stride-1 convolutions, one per output phase (the sub-pixel form).

Along one axis, output ``a*s + phase`` sums input ``a + offset`` times kernel entry ``index`` over a
fixed set of taps for each phase: every s-th kernel entry, read backwards. A stride-1 correlation
over the phase's input window with those entries computes exactly those products, so each output
is the same sum the transposed convolution forms (entries a phase never reads are zeros; a phase
reading none is its bias alone).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AxisPhases:
    """One spatial axis of a transposed convolution: input ``size``, ``kernel``, ``stride``, torch ``pad``
    and the output size ``out`` (output_padding included)."""

    size: int
    kernel: int
    stride: int
    pad: int
    out: int

    @property
    def steps(self) -> int:
        """Outputs of each phase, ceil(out / stride): the last phases may compute a few past ``out``."""
        return -(-self.out // self.stride)

    def taps(self, phase: int) -> list[tuple[int, int]]:
        """(input offset, kernel index) of each product output phase ``phase`` sums, leaving out taps that
        read padding at every step."""
        d, r = divmod(phase + self.pad, self.stride)
        taps = [(d - j, k) for j, k in enumerate(range(r, self.kernel, self.stride))]
        return [(o, k) for o, k in taps if -self.steps < o < self.size]

    def window(self, phases) -> tuple[int, int]:
        """(first, last) input offset the taps of ``phases`` read; (0, 0) when they read none."""
        offsets = [o for p in phases for o, _ in self.taps(p)]
        return (min(offsets), max(offsets)) if offsets else (0, 0)

    def crop(self, window: tuple[int, int]) -> tuple[int, int, int, int]:
        """(start, count) of the input a stride-1 pass over ``window`` reads, and its (before, after)
        padding: ``steps`` outputs, a kernel of ``last - first + 1``."""
        first, last = window[0], self.steps - 1 + window[1]
        start, end = max(first, 0), min(last, self.size - 1)
        return start, end - start + 1, start - first, last - end


def row_phase_weights(w: np.ndarray, rows: AxisPhases, cols: AxisPhases, phase: int) -> np.ndarray:
    """OHWI weights of row ``phase``'s stride-1 convolution from IOHW transposed-convolution weights ``w``:
    output channel ``px * C + c`` holds column phase ``px`` of channel ``c``, over the row phase's window
    and the window of all column phases."""
    cin, c = w.shape[:2]
    (top, bottom), (left, right) = rows.window([phase]), cols.window(range(cols.stride))
    out = np.zeros((cols.stride, c, bottom - top + 1, right - left + 1, cin), w.dtype)
    for oy, ky in rows.taps(phase):
        for px in range(cols.stride):
            for ox, kx in cols.taps(px):
                out[px, :, oy - top, ox - left, :] = w[:, :, ky, kx].T
    return out.reshape(cols.stride * c, *out.shape[2:])
