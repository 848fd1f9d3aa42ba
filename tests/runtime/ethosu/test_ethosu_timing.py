"""Where a command stream's time goes: the performance model's estimate per NPU operation, the counters
ExecuTorch's Ethos-U runner reads (beats: exactly the bytes the simulation moved), the profile and trace of a
whole program (`tosakit run --profile --trace`), and the NPU operations in the ETDump."""

from __future__ import annotations

import json

import pytest
import torch

from support.npu import NpuWorkNet, assert_counters_exact
from tosakit.flow import compile
from tosakit.runtime.ethosu.hardware import ACCELERATORS
from tosakit.runtime.ethosu.system import memory_system
from tosakit.verify.timing import check_timing


_compiled: dict = {}


def _net(target: str, debug_info: bool = False):
    """The net compiled once per test process for ``target`` (carrying its TOSA with ``debug_info``)."""
    from tosakit.specs import EthosUCompileSpec

    if (target, debug_info) not in _compiled:
        torch.manual_seed(0)
        inputs = (torch.randn(1, 8, 16, 16),)
        spec = EthosUCompileSpec(target).with_debug_info(debug_info)
        _compiled[target, debug_info] = (compile(NpuWorkNet().eval(), inputs, spec, quantize=True, calibration=[inputs]),
                                         inputs)
    return _compiled[target, debug_info]


def _delegates(compiled):
    return [m for m in compiled.edge.program.graph_module.children() if getattr(m, "backend_id", "") == "EthosUBackend"]


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_counters_are_the_bytes_moved(target):
    """Every operation's beats: its reads and writes, counted apart from the simulator, on the AXI port of its
    region's memory, in bus-width beats (``_u55``/``_u85`` below name the target)."""
    compiled, _ = _net(target)
    assert assert_counters_exact(compiled.edge) > 3


def test_counters_are_the_bytes_moved_u55():
    compiled, _ = _net("ethos-u55-128")
    profile = check_timing(_delegates(compiled)[0]).profile
    totals = profile.counters()
    assert totals["AXI0_RD_DATA_BEAT_RECEIVED"] > 0 and totals["AXI0_WR_DATA_BEAT_WRITTEN"] > 0
    assert totals["AXI1_RD_DATA_BEAT_RECEIVED"] > 0  # Shared_Sram: the weights stream from flash on AXI1
    assert totals["NPU_ACTIVE"] == profile.total_cycles > 0


def test_counters_are_the_bytes_moved_u85():
    compiled, _ = _net("ethos-u85-256")
    profile = check_timing(_delegates(compiled)[0]).profile
    totals = profile.counters()
    assert totals["SRAM_RD_DATA_BEAT_RECEIVED"] > 0 and totals["EXT_RD_DATA_BEAT_RECEIVED"] == 0  # Sram_Only
    assert 0 < totals["MAC_ACTIVE"] <= totals["NPU_ACTIVE"]


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u65-256", "ethos-u85-256", "ethos-u85-2048"])
def test_the_model_lands_near_velas_estimate(target):
    """The simulator's whole-stream cycles within 10% of Vela's own estimate for the same compile, and each of
    Vela's operations within 20% (the bench prints every model's figures)."""
    compiled, _ = _net(target)
    check = check_timing(_delegates(compiled)[0])
    assert check.why is None and check.operations
    assert abs(check.ratio - 1) <= 0.10, (check.simulated, check.vela)
    assert len(check.within(0.20)) == len(check.operations), [
        (o.name, o.operator, o.simulated, o.vela) for o in check.operations]


def test_memory_system_reads_velas_ini():
    """Regions map to the memory mode's areas, bandwidth is the AXI width times the clock scale (Vela's rule)."""
    u55 = memory_system(["--system-config=Ethos_U55_High_End_Embedded", "--memory-mode=Shared_Sram"],
                        ACCELERATORS["ethos-u55-128"])
    assert (u55.memory(0).name, u55.memory(0).axi, u55.memory(0).bandwidth) == ("OffChipFlash", 1, 1.0)
    assert (u55.memory(1).name, u55.memory(1).bandwidth, u55.clock_hz) == ("Sram", 8.0, 500e6)
    u85 = memory_system(["--system-config=Ethos_U85_SYS_DRAM_Mid", "--memory-mode=Dedicated_Sram_384KB"],
                        ACCELERATORS["ethos-u85-256"])
    assert (u85.memory(1).name, u85.memory(1).bandwidth, u85.memory(2).name) == ("Dram", 12.0, "Sram")
    unknown = memory_system(["--system-config=NoSuchSystem"], ACCELERATORS["ethos-u85-256"])
    assert unknown.system_config == "Ethos_U85_SYS_DRAM_Mid"  # the target's default, never a file the program names


def test_profile_trace_and_etdump_fp(tmp_path, capsys):
    """`tosakit run --profile --trace --etdump` on a delegated program: the table, a trace Perfetto's JSON importer
    takes (complete events with ts/dur, thread names), and an ETDump whose delegate events are the NPU operations.
    (``_fp``: the program's float boundary runs on the CPU.)"""
    from tosakit.cli import main
    from tosakit.program import etdump

    compiled, _ = _net("ethos-u55-128")
    pte = compiled.program.save(tmp_path / "net.pte")
    trace, dump = tmp_path / "net.json", tmp_path / "net.etdp"
    assert main(["run", str(pte), "--random", "--profile", "--trace", str(trace), "--etdump", str(dump)]) == 0
    out = capsys.readouterr().out
    assert "Profile of forward" in out and "Top 10 by estimated time" in out and "NPU counters" in out
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert complete and all(isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and e["pid"] == 1 for e in complete)
    assert {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"} == {"CPU", "NPU", "DMA"}
    npu = [e for e in complete if e["cat"] == "NPU"]
    assert npu and all(e["args"]["cycles"] > 0 for e in npu)
    assert any(e["cat"] == "CPU" for e in complete)  # the quantize at the boundary
    ops = sum(1 for e in complete if e["cat"] in ("NPU", "DMA"))
    runs = etdump.deserialize_etdump(dump.read_bytes()).run_data
    delegate_events = [e.profile_event for e in runs[-1].events
                       if e.profile_event is not None and e.profile_event.delegate_debug_id_int >= 0]
    assert len(delegate_events) == ops
    assert json.loads(delegate_events[0].delegate_debug_metadata)["estimated"] is True


def test_profile_is_the_same_in_the_sandbox_int(tmp_path):
    """A file from anywhere simulates in the child process: its profile crosses back whole, the same as in
    process."""
    from tosakit.runtime import load

    compiled, inputs = _net("ethos-u85-256")
    pte = compiled.program.save(tmp_path / "net.pte")
    isolated = load(pte)
    assert isolated.isolate
    _, steps = isolated.run_profiled(inputs)
    isolated.isolate = False
    _, again = isolated.run_profiled(inputs)
    npu = [s.npu for s in steps if s.npu is not None]
    local = [s.npu for s in again if s.npu is not None]
    assert npu and [p.operations for p in npu] == [p.operations for p in local]


def test_profile_refuses_bad_combinations(tmp_path):
    from tosakit.cli import main

    compiled, _ = _net("ethos-u55-128")
    pte = compiled.program.save(tmp_path / "net.pte")
    assert main(["run", str(pte), "--random", "--profile", "--verify"]) == 2
    assert main(["run", str(pte), "--random", "--trace", str(tmp_path)]) == 2  # a folder
    assert not list(tmp_path.glob("*.json"))


def test_profile_names_what_each_operation_computes_int(tmp_path, capsys):
    """A program carrying its TOSA (--debug-info): each NPU operation named by the TOSA operator and tensor Vela's
    operation map pairs it with."""
    from tosakit.cli import main

    compiled, _ = _net("ethos-u55-128", debug_info=True)
    pte = compiled.program.save(tmp_path / "net.pte")
    assert main(["run", str(pte), "--random", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "CONV2D -> " in out and "DEPTHWISE_CONV2D -> " in out, out


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_a_zoo_model_lands_near_velas_estimate(target):
    """MLPerf Tiny's DS-CNN (``_u55``/``_u85``): whole-network within 10% of Vela, its operations within 20% (on the
    Ethos-U85 its first convolution's weights are in the 2:4 sparse format, which halves its MAC steps)."""
    from tosakit.zoo import MODELS

    module, inputs = MODELS["ds_cnn"].factory()
    compiled = compile(module.eval(), inputs, target, quantize=True, calibration=[inputs])
    [check] = [check_timing(d) for d in _delegates(compiled)]
    assert abs(check.ratio - 1) <= 0.10, (check.simulated, check.vela)
    assert len(check.within(0.20)) == len(check.operations) > 5, [
        (o.name, o.operator, o.simulated, o.vela) for o in check.operations if abs(o.ratio - 1) > 0.2]


def test_profile_says_what_has_no_estimate_int(tmp_path, capsys):
    """A delegate run from its TOSA has no device estimate: its host time stands in, and the total says so."""
    from tosakit.cli import main

    compiled, _ = _net("ethos-u55-128", debug_info=True)
    pte = compiled.program.save(tmp_path / "net.pte")
    assert main(["run", str(pte), "--random", "--engine", "tosa", "--profile"]) == 0
    out = capsys.readouterr().out
    assert "EthosUBackend (run on tosa)" in out and "with no estimate" in out and "--engine npu" in out, out


# The built-in models the wider zoo's tests (tests/zoo) leave out; those check their counters there.
OTHERS = ["add", "add3", "softmax", "digits", "waves", "mv2"]


@pytest.mark.slow
@pytest.mark.parametrize("name", OTHERS)
@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_every_builtin_models_counters_are_its_bytes_moved(name, target):
    """The rest of the built-in models (``_u55``/``_u85`` in the target): each operation's beats are its bytes."""
    from tosakit.zoo import MODELS

    module, inputs = MODELS[name].factory()
    compiled = compile(module.eval(), inputs, target, quantize=True, calibration=[inputs])
    assert assert_counters_exact(compiled.edge) > 0


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u65-256"])
def test_softmax_operations_land_on_velas_u55(target):
    """Softmax (``_u55``, and on the Ethos-U65): its REDUCE_SUM (a 1x1 pooling to depth 1 that sums, not a data move)
    and its subtraction of an int32 scalar read from flash (read once, rounded as IFM1 is stored) as Vela estimates
    them; the one operation apart is the one that waits on its LUT's DMA from flash on the Ethos-U55 (Vela's estimate
    leaves that transfer out), and only by that DMA's cycles."""
    from tosakit.zoo import MODELS

    module, inputs = MODELS["softmax"].factory()
    compiled = compile(module.eval(), inputs, target, quantize=True, calibration=[inputs])
    [check] = [check_timing(d) for d in _delegates(compiled)]
    assert {o.operator for o in check.operations} >= {"ReduceSum", "Sub"}
    apart = [o for o in check.operations if o not in check.within(0.01)]
    [dma] = [op for op in check.profile.operations if op.operation == "DMA_START"]
    if target == "ethos-u65-256":  # its LUT DMA overlaps the operation before
        assert apart == [] and check.simulated == check.vela
    else:
        [(lut_op, vela)] = [(o.simulated, o.vela) for o in apart]
        before = check.profile.operations[0].cycles  # the DMA runs beside the operation before it
        assert lut_op - vela == dma.cycles - before
