"""The Ethos-U simulator on hostile payloads: damage refused with a TosakitError naming the command's
offset, huge operations refused before any work, and the mutation sweep's findings (fuzz/npu_sweep.py)
pinned. Each payload runs in a child process under an address-space limit, so a crash or exit (Vela's weight
codec is native code) or a runaway allocation fails its test, not the test run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[3] / "fuzz"
sys.path.insert(0, str(FUZZ))
from npu_sweep import Parts, report, sweep  # noqa: E402
from seeds import build_npu_seeds  # noqa: E402

from tosakit.runtime.ethosu.registers import U55  # noqa: E402

CHILD_MEMORY = 1 << 30  # address space the child may add to what its imports mapped
CODES = {r.name: code for code, r in U55.items()}

_CHILD = """
import json, resource, sys
sys.path.insert(0, sys.argv[3])
import tosakit.runtime.ethosu.weights
from npu_sweep import inputs_for
from tosakit.backends.ethosu.payload import parse_payload
from tosakit.errors import TosakitError
from tosakit.runtime.ethosu.simulate import simulate

blob = open(sys.argv[1], "rb").read()
with open("/proc/self/statm") as f:
    limit = int(f.read().split()[0]) * resource.getpagesize() + int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
try:
    payload = parse_payload(blob)
    answer = {"outcome": "ran", "message": str(len(simulate(payload, inputs_for(payload)).operations))}
except TosakitError as exc:
    answer = {"outcome": "refused", "kind": type(exc).__name__, "message": exc.message}
except Exception as exc:
    answer = {"outcome": "foreign", "kind": type(exc).__name__, "message": str(exc)[:300]}
print("RESULT " + json.dumps(answer), flush=True)
"""


def outcome(blob: bytes, folder: Path) -> dict:
    """``blob`` parsed and simulated in a child process with CHILD_MEMORY of address space: what happened
    ("ran", "refused" with a TosakitError, "foreign" for another exception, "died" for a crash or exit)."""
    path = folder / "payload.bin"
    path.write_bytes(blob)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(CHILD_MEMORY), str(FUZZ)],
                          capture_output=True, text=True, env=env, timeout=600)  # a hang guard, not a figure
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    last = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or [""]
    return {"outcome": "died", "kind": f"exit status {proc.returncode}", "message": last[0]}


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> dict[str, bytes]:
    """The NPU seed payloads of fuzz/seeds.py, by name."""
    names = ("digits_u55_128", "softmax_u55_128", "audio1d_u55_256_sram_only")
    return {p.stem: p.read_bytes() for p in build_npu_seeds(tmp_path_factory.mktemp("npu-seeds"), names)}


def _ops(parts: Parts, name: str) -> list[int]:
    """Word indices of the commands named ``name``."""
    return [i for i, _ in parts.commands() if getattr(U55.get(parts.words[i] & 0xFFFF), "name", None) == name]


def _offset(parts: Parts, word: int) -> int:
    """The command-stream offset of the command at word index ``word``."""
    return 4 * (word - parts.stream()[0] - 1)


def _insert(parts: Parts, word: int, register: str, value: int) -> int:
    """Insert a command setting ``register`` to ``value`` (the parameter of a cmd0, the data word of a cmd1)
    before word index ``word``; how many words were inserted."""
    code = CODES[register]
    words = [code, value] if U55[code].has_payload else [code | value << 16]
    parts.words[word:word] = words
    at, length = parts.stream()
    parts.set_stream_length(at, length + len(words))
    return len(words)


def _set_before(parts: Parts, op: str, settings: dict[str, int], k: int = 0) -> int:
    """``settings`` (register: value) set just before the ``k``-th command ``op``; that command's new offset."""
    word = _ops(parts, op)[k]
    for register, value in settings.items():
        word += _insert(parts, word, register, value)
    return _offset(parts, word)


def _refused_at(result: dict, offset: int, *words: str) -> None:
    assert result["outcome"] == "refused", result
    assert f"offset {offset:#x} " in result["message"] or f"offset {offset:#08x} " in result["message"], result
    for w in words:
        assert w in result["message"], result


# ------------------------------------------------------------------ damage named by its command offset


def test_stream_ending_inside_a_command_names_it(seeds, tmp_path):
    """The command stream cut after the command word of its last cmd1 (the header's length fixed to match):
    that command lacks its data word."""
    parts = Parts(seeds["digits_u55_128"])
    last = [i for i, cmd1 in parts.commands() if cmd1][-1]
    del parts.words[last + 1:]
    at, _ = parts.stream()
    parts.set_stream_length(at, last + 1 - at - 1)
    _refused_at(outcome(parts.pack(), tmp_path), _offset(parts, last), "lacks its data word")


def test_cut_cmd_data_names_the_header_byte(seeds, tmp_path):
    """cmd_data cut in half: the driver header's stream length names more words than are left."""
    parts = Parts(seeds["digits_u55_128"])
    del parts.words[len(parts.words) // 2:]
    result = outcome(parts.pack(), tmp_path)
    assert result["outcome"] == "refused" and "cmd_data byte 0x" in result["message"], result
    assert "the header gives the command stream" in result["message"], result


def test_unknown_opcode_names_its_offset(seeds, tmp_path):
    parts = Parts(seeds["digits_u55_128"])
    conv = _ops(parts, "NPU_OP_CONV")[1]
    parts.words[conv] = 0x3FF0
    _refused_at(outcome(parts.pack(), tmp_path), _offset(parts, conv), "unknown command code 0x3ff0")


@pytest.mark.parametrize("register,verb", [("NPU_SET_OFM_BASE0", "writes"), ("NPU_SET_IFM_BASE0", "reads"),
                                           ("NPU_SET_WEIGHT_BASE", "reads")])
def test_address_outside_its_region_names_the_command(register, verb, seeds, tmp_path):
    parts = Parts(seeds["digits_u55_128"])
    offset = _set_before(parts, "NPU_OP_CONV", {register: 0x7FFF0000}, k=1)
    _refused_at(outcome(parts.pack(), tmp_path), offset, "(NPU_OP_CONV)", verb, "0x7fff0000")


def test_read_of_unwritten_scratch_names_the_command(seeds, tmp_path):
    """The first operation's IFM moved into scratch bytes added past the arena, which nothing writes."""
    parts = Parts(seeds["digits_u55_128"])
    unwritten = parts.scratch
    parts.scratch += 64 << 10
    offset = _set_before(parts, "NPU_OP_CONV", {"NPU_SET_IFM_REGION": 1, "NPU_SET_IFM_BASE0": unwritten})
    _refused_at(outcome(parts.pack(), tmp_path), offset, "(NPU_OP_CONV)",
                f"reads byte {unwritten:#x} of region 1 (scratch), which no earlier command or input wrote")


# ------------------------------------------------------------------ huge operations: refused before the work

_OPS = {"conv": ("digits_u55_128", "NPU_OP_CONV"), "pool": ("digits_u55_128", "NPU_OP_POOL"),
        "elementwise": ("softmax_u55_128", "NPU_OP_ELEMENTWISE"),
        "depthwise": ("audio1d_u55_256_sram_only", "NPU_OP_DEPTHWISE")}
_DIMS = {"width": ("WIDTH",), "height": ("HEIGHT",), "depth": ("DEPTH",), "height_width": ("HEIGHT", "WIDTH"),
         "all": ("HEIGHT", "WIDTH", "DEPTH")}


@pytest.mark.parametrize("dims", _DIMS)
@pytest.mark.parametrize("op", _OPS)
def test_huge_ofm_is_refused_within_bounded_memory(op, dims, seeds, tmp_path):
    """An operation whose OFM claims 65536 in some dimensions: a TosakitError naming it, under the child's
    address-space limit (no multi-GB address grid made first)."""
    seed, name = _OPS[op]
    parts = Parts(seeds[seed])
    offset = _set_before(parts, name, {f"NPU_SET_OFM_{d}_M1": 0xFFFF for d in _DIMS[dims]})
    _refused_at(outcome(parts.pack(), tmp_path), offset, f"({name})")


# ------------------------------------------------------------------ the mutation sweep's findings


def test_damaged_weight_stream_is_refused_not_an_exit(seeds, tmp_path):
    """Sweep finding (10% of damaged payloads): a weight stream cut short makes Vela's codec print
    "bitbuf_getbit: underrun" and call exit(1), ending the simulating process."""
    parts = Parts(seeds["digits_u55_128"])
    offset = _set_before(parts, "NPU_OP_CONV", {"NPU_SET_WEIGHT_LENGTH": 16})
    _refused_at(outcome(parts.pack(), tmp_path), offset, "(NPU_OP_CONV)")


def test_weight_length_past_its_region_is_refused_before_allocating(seeds, tmp_path):
    """Sweep finding: a 3.75 GiB WEIGHT_LENGTH made a 30 GiB address array (MemoryError) before the region check."""
    parts = Parts(seeds["digits_u55_128"])
    offset = _set_before(parts, "NPU_OP_CONV", {"NPU_SET_WEIGHT_LENGTH": 0xF0000000})
    _refused_at(outcome(parts.pack(), tmp_path), offset, "(NPU_OP_CONV)")


def test_scale_records_from_the_wrong_place_are_run_or_refused(seeds, tmp_path):
    """Sweep finding (case 180, one bit): SCALE_BASE 0 -> 0x80 reads weight bytes as bias and scale; the
    scaled accumulator leaves int64 and scale_output raised OverflowError."""
    parts = Parts(seeds["digits_u55_128"])
    first = _ops(parts, "NPU_SET_SCALE_BASE")[0]
    parts.words[first + 1] = 0x80
    assert outcome(parts.pack(), tmp_path)["outcome"] in ("ran", "refused")


def test_output_table_beyond_memory_is_refused(seeds, tmp_path):
    """Sweep finding: an output of 2**30 x 10 elements in the I/O table: a 80 GiB address array (MemoryError)."""
    parts = Parts(seeds["digits_u55_128"])
    parts.tables["outputs"][0][0][0] = 1 << 30
    assert outcome(parts.pack(), tmp_path)["outcome"] == "refused"


def test_largest_scratch_size_is_run_or_refused(seeds, tmp_path):
    """Sweep finding: scratch_size 0xFFFFFFFF allocates 4 GiB of scratch and 4 GiB of written-flags up
    front; under an address-space limit that is a MemoryError."""
    parts = Parts(seeds["digits_u55_128"])
    parts.scratch = 0xFFFFFFFF
    assert outcome(parts.pack(), tmp_path)["outcome"] in ("ran", "refused")


@pytest.mark.slow
def test_npu_mutation_sweep(tmp_path):
    """CI's share of `make fuzz`'s simulator sweep: damaged payloads of every NPU seed, in child processes."""
    seeds = build_npu_seeds(tmp_path / "seeds")
    summary = sweep(seeds, cases=int(os.environ.get("TOSAKIT_NPU_SWEEP_CASES", 600)), jobs=2, progress=False)
    print(report(summary))
    assert not summary["problems"], report(summary)
