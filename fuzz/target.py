"""Coverage-guided fuzzing (atheris) of everything a .pte from anywhere reaches: the reader, whole-program
validation, the TOSA and Ethos-U payload checks, `inspect`'s description and the run itself (delegates
in the reference model's child process). Any exception but TosakitError, any crash or hang is a finding.

    python fuzz/target.py -max_total_time=600 fuzz/corpus/live fuzz/corpus/seeds   # make fuzz
"""

from __future__ import annotations

import sys

import atheris
import torch  # noqa: F401  (imported, not instrumented: coverage is tosakit's)

with atheris.instrument_imports(include=["tosakit"]):
    from tosakit.errors import TosakitError
    from tosakit.runtime import Limits, LoadedProgram
    from tosakit.runtime.inspect import describe

LIMITS = Limits(max_memory=256 << 20, timeout=20.0, max_steps=100_000)


def test_one_input(data: bytes) -> None:
    try:
        loaded = LoadedProgram(data, "fuzzed.pte", limits=LIMITS)
        describe(loaded)
        inputs = [torch.zeros(s.shape, dtype=s.dtype) for s in loaded.input_specs()]
        loaded.run(inputs)
    except TosakitError:
        pass


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()
