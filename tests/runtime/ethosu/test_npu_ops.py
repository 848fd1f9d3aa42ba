"""Per NPU operation (issue 14's --verify): each Ethos-U55/U65 operation's simulated output against the TOSA
tensor Vela says it computes (its debug database and high-level command stream), on the reference model with
every tensor made an output. The comparisons are exact; a wrong operation is named first."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from support.npu import npu_inputs
from support.op_cases import sweep_models
from tosakit.backends.ethosu.payload import parse_payload
from tosakit.cli import main
from tosakit.flow import compile
from tosakit.program import LoweredBackendModule
from tosakit.runtime.ethosu import npu
from tosakit.runtime.ethosu.memory import NpuAccessError
from tosakit.runtime.tosa_inprocess import run_tosa
from tosakit.runtime.tosa_validate import check_tosa
from tosakit.specs import EthosUCompileSpec
from tosakit.verify.npu_ops import SUMS_NOTE, compare_operations, with_outputs
from tosakit.verify.operation_map import operation_map
from tosakit.zoo import MODELS

SLOW = {"mv2", "mv3", "resnet18", "transformer", "lstm", "unet"}


def _delegates(name: str, target: str = "ethos-u55-128", memory_mode: str | None = None):
    torch.manual_seed(0)
    model, inputs = MODELS[name].factory()
    spec = EthosUCompileSpec(target, memory_mode=memory_mode)
    compiled = compile(model.eval(), inputs, spec, quantize=True, calibration=[inputs])
    return [m for m in compiled.edge.program.graph_module.children()
            if isinstance(m, LoweredBackendModule) and m.backend_id == "EthosUBackend"], list(spec.compiler_flags)


def _reports(module, flags, seed=0):
    payload = parse_payload(module.processed_bytes)
    mapping = operation_map(module.tosa, flags, payload.cmd_data)
    assert mapping.why is None, mapping.why
    return compare_operations("d", module.tosa, payload, mapping, npu_inputs(payload, seed)), mapping


def test_with_outputs_exposes_every_tensor_and_keeps_the_outputs():
    """The rewritten flatbuffer passes the whole-file check, and its first outputs are the graph's own."""
    [module], _ = _delegates("digits")
    summary = check_tosa(module.tosa, "digits", 1 << 31)
    exposed, names = with_outputs(module.tosa, ["layer-3", "layer-4"])
    assert names[:len(summary.outputs)] == [t.name for t in summary.outputs] and names[-2:] == ["layer-3", "layer-4"]
    assert [t.name for t in check_tosa(exposed, "exposed", 1 << 31).outputs] == names
    x = [np.random.default_rng(0).integers(-128, 128, t.shape).astype(np.int8) for t in summary.inputs]
    plain, more = run_tosa(module.tosa, x), run_tosa(exposed, x)
    assert len(more) == len(names) and all(np.array_equal(a, b) for a, b in zip(plain, more))
    assert more[-2].shape == (1, 8, 8, 16) and more[-1].shape == (1, 4, 4, 16)  # the conv (its ReLU no CLAMP), the pool


@pytest.mark.parametrize("config", [("ethos-u55-128", None), ("ethos-u65-256", "Dedicated_Sram")])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in sweep_models()])
def test_every_operation_of_builtin_models_bit_exact(name, config):
    """Every operation compared equals its TOSA tensor bit for bit; the rest say why they were not compared
    (a transpose Vela runs as strided copies, a tensor of Vela's own), and most are compared."""
    delegates, flags = _delegates(name, *config)
    compared = total = 0
    for module in delegates:
        reports, mapping = _reports(module, flags)
        assert len(reports) == len(mapping.operations) >= 1
        assert not [str(r) for r in reports if r.differ]
        assert all(r.note for r in reports if not r.values)
        compared += sum(1 for r in reports if r.values)
        total += len(reports)
    assert compared >= 0.6 * total, (compared, total)


class EncoderBlock(torch.nn.Module):
    """A transformer encoder block: layer norm, attention, residuals (Vela chains its elementwise steps on U85)."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(32, 2, 64, dropout=0.0, batch_first=True)

    def forward(self, x):
        return self.layer(x)


UNCOMPARED_U85 = (SUMS_NOTE, "it writes a tensor of Vela's own (")


@pytest.mark.parametrize("name", ["digits", "audio1d", "encoder"])
def test_every_operation_bit_exact_u85(name):
    """Ethos-U85 streams map exactly too: an operation chained into the next (its result compared in the chain
    buffer with the TOSA tensor it computes), an OFM written transposed, a gather the DMA runs (no operation of its
    own); every operation compared equals its TOSA tensor, at least 90% are compared, the rest say why (they had
    no exact map, then chained and transposed ones were not compared: 77 of 92 on the encoder)."""
    torch.manual_seed(0)
    model, inputs = (EncoderBlock(), (torch.randn(1, 16, 32),)) if name == "encoder" else MODELS[name].factory()
    spec = EthosUCompileSpec("ethos-u85-256")
    compiled = compile(model.eval(), inputs, spec, quantize=True, calibration=[inputs])
    modules = [m for m in compiled.edge.program.graph_module.children() if isinstance(m, LoweredBackendModule)]
    compared = total = 0
    for module in modules:
        reports, mapping = _reports(module, list(spec.compiler_flags))
        assert not [str(r) for r in reports if r.differ]
        assert all(r.note.startswith(UNCOMPARED_U85) for r in reports if not r.values), reports
        compared += sum(1 for r in reports if r.values)
        total += len(reports)
    assert total and compared >= 0.9 * total, (compared, total)


def test_a_wrong_operation_is_named_first(monkeypatch):
    """The second convolution or pooling operation made wrong (its accumulators offset by 2**16): that operation
    is the first to differ, every operation before it is bit-exact."""
    [module], flags = _delegates("digits")
    calls, real = [], npu._output

    def offset(machine, acc, scale, shift):
        calls.append(machine.memory.where)
        real(machine, acc + (1 << 16) if len(calls) == 2 else acc, scale, shift)

    monkeypatch.setattr(npu, "_output", offset)
    reports, _ = _reports(module, flags)
    first = next(r for r in reports if r.differ)
    assert f"offset {first.offset:#x} " in calls[1] + " "
    before = [r for r in reports if r.offset < first.offset and r.values]
    assert before and not any(r.differ for r in before)


def test_operations_after_a_fault_are_not_run(monkeypatch):
    """The simulation stops at a fault: the operations before it are compared, the later ones say why not."""
    [module], flags = _delegates("digits")

    def fault(machine, command):
        raise NpuAccessError(f"{machine.memory.where} writes bytes [0x0, 0x10) of region 1 (scratch)")

    monkeypatch.setitem(npu.OPERATIONS, "NPU_OP_POOL", fault)
    reports, _ = _reports(module, flags)
    assert reports[0].values and not reports[0].differ
    stopped = [r for r in reports if r.note.startswith("not run: the simulation stopped")]
    assert stopped and "(NPU_OP_POOL) writes bytes" in stopped[0].note


def test_compile_verify_reports_npu_operations(tmp_path, capsys):
    code = main(["compile", "-q", "-m", "digits", "--delegate", "--quantize", "--verify", "-o",
                 str(tmp_path / "d.pte"), "-i", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert code == 0
    assert "NPU operations: 4 of 5 compared with the TOSA tensor each computes: all bit-exact" in printed, printed
    saved = json.loads((tmp_path / "out" / "report.json").read_text())["verification"]["npu_operations"]
    assert len(saved) == 5 and sum(1 for r in saved if r["values"] and not r["differ"]) == 4
    page = (tmp_path / "out" / "report.html").read_text()
    assert "<h2>Per NPU operation</h2>" in page and "4 of 5 compared, 0 differ" in page
    # and where the time goes: the simulated run's timeline, its NPU operations timed
    assert "<h2>Where the time goes (estimated on the device)</h2>" in page and "AXI0_RD_DATA_BEAT_RECEIVED" in page
    assert page.count("<td>NPU</td>") >= 5


def test_summary_never_calls_uncompared_operations_bit_exact():
    """An Ethos-U85 stream with no exact map compares nothing: the summary says so instead of "all bit-exact"."""
    from tosakit.verify.npu_ops import NpuOpReport, summary

    uncompared = [NpuOpReport("lowered_module_0", 0x100, "Conv2D", "CONV2D #0", "t", 0, 0, 0, "no exact map")]
    [head, detail] = summary(uncompared)
    assert head.endswith("0 of 1 compared with the TOSA tensor each computes: none could be compared, so none is "
                         "shown bit-exact") and "not compared: no exact map" in detail
    compared = [NpuOpReport("lowered_module_0", 0x100, "Conv2D", "CONV2D #0", "t", 8, 0, 0)]
    assert summary(compared)[0].endswith("1 of 1 compared with the TOSA tensor each computes: all bit-exact")
