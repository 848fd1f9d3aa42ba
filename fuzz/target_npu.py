"""Coverage-guided fuzzing (atheris) of the Ethos-U simulator: an Ethos-U delegate payload's bytes through
``parse_payload`` and ``simulate()`` in this process, mutated half the time by libFuzzer and half by the
sweep's payload-aware mutations (command words, weights, I/O table, scratch size). Any exception but
TosakitError, a crash or exit (Vela's weight codec is native code), a hang or runaway memory is a finding.

    python fuzz/target_npu.py -max_total_time=300 fuzz/corpus/npu-live fuzz/corpus/npu-seeds   # make fuzz
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The weight module runs uninstrumented: atheris 2.3.0's bytecode instrumentation on Python 3.11 makes the
# nested loops of brick_order segfault (in pure Python, on a valid seed; the same payload replays cleanly
# without atheris); the mutation sweep covers that module.
with atheris.instrument_imports(include=["tosakit"], exclude=["tosakit.runtime.ethosu.weights"]):
    import tosakit.backends.ethosu.payload  # noqa: F401  (imported here to be instrumented)
    import tosakit.runtime.ethosu.simulate  # noqa: F401
    from tosakit.errors import TosakitError

from npu_sweep import execute, mutate  # noqa: E402


def test_one_input(data: bytes) -> None:
    try:
        execute(data)
    except TosakitError:
        pass


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    """The sweep's payload-aware mutation for half the seeds (when ``data`` is still a payload), libFuzzer's
    byte mutation for the rest."""
    rng = random.Random(seed)
    if rng.random() < 0.5:
        try:
            blob, _ = mutate(data, rng)
        except TosakitError:  # no longer a payload: only byte mutations apply
            blob = b""
        if blob and len(blob) <= max_size:
            return blob
    return atheris.Mutate(data, max_size)


if __name__ == "__main__":
    atheris.Setup(sys.argv, test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()
