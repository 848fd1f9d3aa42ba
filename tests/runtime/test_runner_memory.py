"""The runner memory tosakit states for a program (``tosakit.runtime.pools``) against what ExecuTorch 1.5.1's
C++ runtime allocates when it loads and runs the program: tests/oracle/memory_runner.cpp, built once against the
oracle venv's libexecutorch.so and kernel libraries, lays out its pools the way arm_executor_runner does
(planned arenas, then load_method, then the inputs' EValues, in the method pool; a separate temp pool) with a
counting allocator, and prints each pool's use. CPU-only programs only: the wheel has no Ethos-U backend."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from support.shared import SharedFiles, run_folder
from tosakit.cli import main
from tosakit.compile_job import CompileOptions, compile_model
from tosakit.runtime import load
from tosakit.runtime import pools as M

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "oracle" / "memory_runner.cpp"
BIG_POOL = 1 << 26

# CPU-only programs (``tosakit compile -m NAME`` without --delegate) of built-in models, together holding every
# kind of value tosakit writes (tensors, ints, doubles, bools, nulls, int, double and tensor lists), and of a
# topk, the one portable kernel that takes temp memory at execute
MODELS = {"add3": {}, "softmax": {}, "digits": {}, "digits_quantized": {"quantize": True}, "conformer": {},
          "unet": {}, "topk": {"input_shapes": [(2, 40)]}, "kv_write": {}}
# Models from files: topk, and a KV cache written at run-time positions (index_put's optional tensor list)
FILES = {"topk": ("TopK", """import torch


class TopK(torch.nn.Module):
    def forward(self, x):
        return torch.topk(x, 3, dim=1).values
"""), "kv_write": ("KV", """import torch


class KV(torch.nn.Module):
    def forward(self, cache, pos, k):
        cache = cache.clone()
        cache[:, pos] = k
        return cache, cache[:, pos]


example_inputs = (torch.zeros(2, 8, 4), torch.tensor([1, 5], dtype=torch.int32), torch.ones(2, 2, 4))
""")}


@pytest.fixture(scope="session")
def memory_runner(et_oracle) -> Path:
    """tests/oracle/memory_runner.cpp built against the oracle's ExecuTorch (cached by source and library)."""
    found = subprocess.run([str(et_oracle.python), "-c", "import importlib.util as u; "
                            "print(u.find_spec('executorch').submodule_search_locations[0])"],
                           capture_output=True, text=True, check=True)
    et = Path(found.stdout.strip())
    key = hashlib.sha256(SOURCE.read_bytes() + str(et).encode()
                         + (et / "lib" / "libexecutorch.so").read_bytes()).hexdigest()[:16]
    binary = REPO / ".pytest_cache" / "memory_runner" / key / "memory_runner"
    if binary.exists():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_name(f"memory_runner.{os.getpid()}")
    build = subprocess.run(
        ["g++", "-std=c++17", "-O1", "-DC10_USING_CUSTOM_GENERATED_MACROS", "-DET_EVENT_TRACER_ENABLED",
         f"-I{et / 'include'}", f"-I{et / 'include/executorch/runtime/core/portable_type/c10'}", str(SOURCE),
         "-o", str(partial), f"-L{et / 'lib'}", f"-Wl,-rpath,{et / 'lib'}", "-Wl,--no-as-needed", "-lexecutorch",
         "-lexecutorch_kernels_optimized", "-lexecutorch_kernels_quantized"], capture_output=True, text=True)
    assert build.returncode == 0, f"building {SOURCE.name} against {et} failed:\n{build.stderr[-3000:]}"
    os.replace(partial, binary)
    return binary


def measure(runner: Path, pte: Path, method_pool: int, temp_pool: int) -> dict:
    """What ExecuTorch allocated loading and running ``pte`` with pools of these sizes (or how it failed)."""
    done = subprocess.run([str(runner), str(pte), str(method_pool), str(temp_pool)], capture_output=True,
                          text=True, timeout=300)
    assert done.stdout.startswith("{"), f"memory_runner died ({done.returncode}): {done.stderr[-2000:]}"
    return json.loads(done.stdout)


def _compile(name: str, pte: Path) -> None:
    """``name``'s CPU-only program (a model of FILES written beside it), at ``pte``."""
    model = name.removesuffix("_quantized")
    if name in FILES:
        attr, text = FILES[name]
        (pte.parent / f"{name}.py").write_text(text)
        model = f"{pte.parent / name}.py:{attr}"
    compile_model(CompileOptions(model_name=model, output=str(pte), quiet=True, **MODELS[name]))


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> SharedFiles:
    """Each model's program, compiled once per test run when a test first needs it."""
    return SharedFiles(run_folder(tmp_path_factory) / "runner_memory", ".pte", _compile)


@pytest.mark.parametrize("name", MODELS)
def test_pools_are_what_executorch_allocates(name, programs, memory_runner):
    """load_method's use of the method pool with the stated temp pool, with an empty one and with one a byte
    too small for the largest operator's metadata; arm_executor_runner's whole method pool; the arenas; the
    temp pool's use at execute: each equals what ExecuTorch's runtime took (and a temp pool a byte smaller
    than an instruction's request fails)."""
    loaded = load(programs[name])
    plan = loaded.plan()
    figures = M.runner_memory(loaded.program, loaded.segments, plan)
    got = measure(memory_runner, programs[name], BIG_POOL, figures.temp_pool)
    assert "error" not in got, got
    assert [size for size, _ in got["arena_allocations"]] == [n for n in figures.arenas if n]
    assert got["load_method"] == figures.method_pool
    assert got["arenas"] + got["load_method"] + got["inputs"] == figures.runner_method_pool
    assert got["temp_at_execute"] == figures.execute_temp
    assert (figures.execute_temp > 0) == (name == "topk") and not figures.kernel_temp_unknown
    assert 0 < got["temp_at_load"] <= figures.load_temp  # the kernel metadata went to the temp pool
    if figures.execute_temp:  # a temp pool smaller than an instruction's request fails at execute
        short = measure(memory_runner, programs[name], BIG_POOL, figures.execute_temp - 1)
        assert (short["stage"], short["error"]) == ("execute", 0x21)  # Error::MemoryAllocationFailed
        return
    without = measure(memory_runner, programs[name], BIG_POOL, 0)
    assert without["load_method"] == figures.method_pool_without_temp > figures.method_pool
    short = measure(memory_runner, programs[name], BIG_POOL, figures.load_temp - 1)
    assert short["load_method"] == M.method_pool_used(plan, figures.load_temp - 1) > figures.method_pool


@pytest.mark.parametrize("name", ["digits_quantized", "conformer"])
def test_the_stated_method_pool_is_the_least_that_loads_and_runs(name, programs, memory_runner):
    loaded = load(programs[name])
    figures = M.runner_memory(loaded.program, loaded.segments, loaded.plan())
    assert "error" not in measure(memory_runner, programs[name], figures.runner_method_pool, figures.temp_pool)
    short = measure(memory_runner, programs[name], figures.runner_method_pool - 1, figures.temp_pool)
    assert short["error"] == 0x21  # Error::MemoryAllocationFailed


def test_type_sizes_are_the_runtimes(programs, memory_runner):
    sizes = measure(memory_runner, programs["add3"], BIG_POOL, 0)["sizeof"]
    assert sizes == {"EValue": M.EVALUE, "TensorImpl": M.TENSOR_IMPL, "Tensor": M.TENSOR,
                     "TensorMeta": M.TENSOR_META, "CompileSpec": M.COMPILE_SPEC, "FreeableBuffer": M.FREEABLE_BUFFER,
                     "BoxedEvalueList<int64_t>": M.BOXED_LIST, "ArrayRef<double>": M.ARRAY_REF,
                     "Span<EValue*>": M.SPAN, "OpFunction": M.POINTER, "optional<Tensor>": M.OPTIONAL_TENSOR,
                     "pointer": M.POINTER}


def test_inspect_compile_and_report_state_them(programs, tmp_path, monkeypatch, capsys):
    loaded = load(programs["digits"])
    figures = M.runner_memory(loaded.program, loaded.segments, loaded.plan())
    assert main(["inspect", str(programs["digits"])]) == 0
    out = capsys.readouterr().out
    assert "runner memory" in out and f"arm_executor_runner, which also places the arenas and the inputs' " \
                                      f"EValues there: {figures.runner_method_pool} B" in out
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "-q", "-m", "digits", "-o", "digits.pte", "-i", "reports"]) == 0
    assert f"method pool {figures.runner_method_pool} B" in capsys.readouterr().out
    report = json.loads((tmp_path / "reports" / "report.json").read_text())
    assert report["runner_memory"] == [figures.as_dict()]


def test_run_refuses_pools_too_small(programs, capsys):
    pte = programs["digits_quantized"]
    loaded = load(pte)
    figures = M.runner_memory(loaded.program, loaded.segments, loaded.plan())
    need = figures.runner_method_pool
    assert main(["run", str(pte), "--random", "--method-pool", str(need - 1)]) == 2
    err = capsys.readouterr().err
    assert f"method allocator pool of {need - 1} bytes is too small" in err and f"needs {need} bytes" in err
    assert main(["run", str(pte), "--random", "--method-pool", str(need), "--temp-pool", "0"]) == 2
    without = M.runner_method_pool(loaded.plan(), 0)
    assert without > need and f"needs {without} bytes beside a 0-byte temp pool" in capsys.readouterr().err
    assert main(["run", str(pte), "--random", "--method-pool", str(need)]) == 0


def test_run_refuses_a_temp_pool_too_small(programs, capsys):
    pte = programs["topk"]
    loaded = load(pte)
    need = M.runner_memory(loaded.program, loaded.segments, loaded.plan()).execute_temp
    assert main(["run", str(pte), "--random", "--temp-pool", str(need - 1)]) == 2
    err = capsys.readouterr().err
    assert f"temp allocator pool of {need - 1} bytes is too small" in err and f"takes {need} bytes" in err
    assert main(["run", str(pte), "--random", "--temp-pool", str(need)]) == 0


def test_compile_states_the_fast_scratch_the_stream_addresses(tmp_path, capsys):
    """Dedicated_Sram: the fast scratch the compile summary states is the span of region 2 the command stream
    addresses when it runs (the simulator's figure), not a guess."""
    from support.npu import ethosu_delegates, npu_inputs

    from tosakit.flow import compile
    from tosakit.runtime.ethosu.simulate import simulate
    from tosakit.specs import EthosUCompileSpec
    from tosakit.zoo import MODELS

    model, inputs = MODELS["digits"].factory()
    compiled = compile(model, inputs, EthosUCompileSpec("ethos-u85-256", memory_mode="Dedicated_Sram"), quantize=True)
    [(tosa, payload)] = ethosu_delegates(compiled)
    addressed = simulate(payload, npu_inputs(payload, 0, tosa)).fast_scratch_bytes
    assert addressed > 0
    assert main(["compile", "-q", "-m", "digits", "-t", "ethos-u85-256", "--memory-mode", "Dedicated_Sram",
                 "--delegate", "--quantize", "-o", str(tmp_path / "d.pte")]) == 0
    assert f"fast scratch: {addressed} B of SRAM the runner lends this delegate" in capsys.readouterr().out
