"""Ethos-U55 and Ethos-U85 programs made by ExecuTorch 1.5.1's own Arm backend (the oracle env,
tests/oracle/et_export.py: its tutorial flow, EthosUQuantizer + EthosUPartitioner) on tosakit's host runtime:

- the .pte carries no TOSA; each delegate's command stream, run on tosakit's simulator from the payload's bytes,
  equals bit for bit the TOSA reference model on the TOSA ExecuTorch compiled it from (its dumped intermediate),
  on seeded inputs over the whole integer range and inside the program on the model's example input;
- `tosakit run` executes the .pte (the engine chosen automatically: the simulator) and gives what the same program
  gives with ExecuTorch's TOSA run for each delegate;
- tosakit lowering the very quantized graph ExecuTorch lowered: whether the two TOSAs are identical (byte for
  byte, or in what they compute), and the two programs' outputs compared; equal wherever the TOSAs are.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from support.npu import assert_npu_bit_exact
from support.shared import made_once, run_folder
from tosakit.backends.ethosu.payload import parse_payload
from tosakit.capture import export
from tosakit.errors import TosakitError
from tosakit.flow import partitioner_for
from tosakit.program import LoweredBackendModule, to_edge_transform_and_lower
from tosakit.program.pte import tosa_key
from tosakit.runtime import load
from tosakit.runtime.tosa_inprocess import run_tosa
from tosakit.runtime.tosa_validate import check_tosa
from tosakit.specs import EthosUCompileSpec
from tosakit.zoo import MODELS

pytestmark = [pytest.mark.oracle, pytest.mark.slow]

TARGET = "ethos-u55-128"
TARGETS = ["ethos-u55-128", "ethos-u85-256"]
# Built-in models ExecuTorch delegates whole on the U55 (mv2, digits, resnet18), and waves: three delegates with
# ExecuTorch's CPU pooling between them. (mv3, transformer and lstm delegate whole too, at more export time.)
NAMES = ["mv2", "digits", "resnet18", "waves"]
# Each model on both targets but resnet18, on ethos-u85-256 only: on the U55 it adds no command mv2's stream lacks.
CASES = [pytest.param(n, t, id=f"{n}-{t}") for n in NAMES for t in TARGETS if (n, t) != ("resnet18", TARGET)]
BLOCKS = ["vela_bin_stream", "cmd_data", "weight_data", "scratch_size", "inputs", "outputs", "vela_end_stream"]


@pytest.fixture(scope="session")
def exported(et_oracle, tmp_path_factory):
    """(name, target) -> (example inputs, et_export.py's result), each exported once per test run into a folder all
    test workers of the run share."""
    import json

    def export_into(name: str, target: str, folder: Path) -> None:
        module, inputs = MODELS[name].factory()
        result = et_oracle.export_ethosu(module.eval(), inputs, folder, name=name, target=target,
                                         bundleio=name == "mv2")
        (folder / "result.json").write_text(json.dumps(result))

    def get(name: str, target: str = TARGET):
        folder = made_once(run_folder(tmp_path_factory) / f"executorch_{name}_{target}",
                           lambda folder: export_into(name, target, folder))
        return tuple(torch.load(folder / f"{name}.inputs.pt")), json.loads((folder / "result.json").read_text())

    return get


def _delegate_tosa(program, result) -> list[tuple[object, bytes, bytes]]:
    """(delegate, payload, ExecuTorch's TOSA for it) in the program's delegate order."""
    tosa = {d["payload_sha256"]: Path(d["tosa"]).read_bytes() for d in result["delegates"]}
    out = []
    for d in program.plan().delegates:
        payload = program.delegate_payload(d)
        out.append((d, payload, tosa[hashlib.sha256(payload).hexdigest()]))
    return out


@pytest.mark.parametrize("name,target", CASES)
def test_executorch_program_simulates_bit_exact(name, target, exported):
    """No TOSA inside ExecuTorch's .pte; each delegate simulated equals its TOSA on the reference model."""
    inputs, result = exported(name, target)
    pte = Path(result["pte"])
    program = load(pte)
    delegates = _delegate_tosa(program, result)
    assert len(delegates) == len(result["delegates"]) >= 1
    assert not program.program.named_data  # nothing carried beside the program: no TOSA, no external blocks
    data = pte.read_bytes()
    for d, blob, tosa in delegates:
        assert d.id == "EthosUBackend" and not program.carries_tosa(d)
        assert tosa not in data and tosa[4:8] == b"TOSA"
        payload = parse_payload(blob)  # strict: block order, sizes, padding, no external blocks
        assert [b for b, _ in payload.blocks] == BLOCKS
        assert_npu_bit_exact(tosa, payload, seeds=(0,))  # whole-range inputs; the model's own input below
    assert len(program.layouts["forward"].delegate_npu) == len(delegates)  # all on the simulator by default

    # inside the program, on the model's own input: the simulator vs ExecuTorch's TOSA, per delegate output
    with_tosa = load(pte, tosa={tosa_key(blob): tosa for _, blob, tosa in delegates})
    outputs, comparisons = with_tosa.run_and_compare(inputs)
    assert len(comparisons) >= len(delegates) and all(c.bit_exact for c in comparisons), \
        [str(c) for c in comparisons if not c.bit_exact]


@pytest.mark.parametrize("name,target", CASES)
def test_tosakit_run_executes_executorch_program(name, target, exported, tmp_path, capsys):
    """`tosakit run X.pte` on ExecuTorch's program (by default on the NPU simulator): what the program gives with
    ExecuTorch's own TOSA for each delegate (the tosa engine), bit for bit; --engine tosa has no TOSA to run."""
    from tosakit.cli import main

    inputs, result = exported(name, target)
    pte = Path(result["pte"])
    program = load(pte)
    delegates = _delegate_tosa(program, result)
    want = load(pte, tosa={tosa_key(blob): tosa for _, blob, tosa in delegates}, engine="tosa").run(inputs)
    np.savez(tmp_path / "in.npz", **{f"arg{i}": x.numpy() for i, x in enumerate(inputs)})
    code = main(["run", str(pte), "--inputs", str(tmp_path / "in.npz"), "--outputs", str(tmp_path / "out.npz")])
    printed, err = capsys.readouterr()
    assert code == 0, err
    assert f"({len(delegates)} Ethos-U delegate(s) on the NPU simulator)" in printed, printed
    with np.load(tmp_path / "out.npz") as saved:
        got = [saved[f"out{i}"] for i in range(len(saved.files))]
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.numpy().dtype and np.array_equal(g, w.numpy()), f"output {k}"
    code = main(["run", str(pte), "--inputs", str(tmp_path / "in.npz"), "--engine", "tosa"])
    err = capsys.readouterr().err
    assert code == 2 and "has no TOSA graph inside the program" in err, err
    # profiled without Vela's database: the file's own command streams, timed
    code = main(["run", str(pte), "--inputs", str(tmp_path / "in.npz"), "--profile"])
    printed = capsys.readouterr().out
    assert code == 0 and "Profile of forward" in printed and f"NPU {target}" in printed, printed


def _assert_same_stream_same_time(mine, theirs, my_steps, their_steps) -> None:
    """Where tosakit's delegate and ExecuTorch's hold the same command stream, their profiles' totals agree
    within 2% (the same stream, the same estimate: only the inputs' values may move it, not at all here)."""
    streams = lambda program: [parse_payload(program.delegate_payload(d)).cmd_data  # noqa: E731
                               for d in program.plan().delegates]
    totals = lambda steps: [s.npu.total_cycles for s in steps if s.npu is not None]  # noqa: E731
    pairs = list(zip(streams(mine), streams(theirs), totals(my_steps), totals(their_steps)))
    assert len(pairs) == len(streams(mine)) and all(t > 0 for *_, a, b in pairs for t in (a, b))
    for ours, executorch, a, b in pairs:
        if ours == executorch:
            assert abs(a - b) <= 0.02 * b, (a, b)


def _tosakit_lowering(result, inputs, target: str):
    """tosakit's edge program for the quantized graph ExecuTorch lowered, for the same Vela configuration.
    ExecuTorch's quantizer rewrites adaptive average pooling as full-range ``slice_copy`` + ``avg_pool2d``;
    tosakit lowers ``slice`` (the same values) and not ``slice_copy``, so that alias is renamed first."""
    graph = torch.export.load(result["quantized"]).module(check_guards=False)
    for node in graph.graph.nodes:
        if node.target is torch.ops.aten.slice_copy.Tensor:
            node.target = torch.ops.aten.slice.Tensor
    graph.recompile()
    spec = EthosUCompileSpec(target)
    assert list(spec.compiler_flags) == result["vela_flags"]  # the same Vela flags as ExecuTorch used
    return to_edge_transform_and_lower(export(graph, tuple(inputs)), partitioner=[partitioner_for(spec)])


def _seeded(tosa: bytes, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for t in check_tosa(tosa, "delegate", 1 << 31).inputs:
        info = np.iinfo(t.dtype.lower())
        out.append(rng.integers(info.min, info.max, size=t.shape, endpoint=True).astype(t.dtype.lower()))
    return out


def _same_function(ours: bytes, theirs: bytes, seeds=(0, 1, 2)) -> bool:
    """Both TOSAs take and give the same tensors and compute the same integers on seeded whole-range inputs."""
    a, b = check_tosa(ours, "tosakit", 1 << 31), check_tosa(theirs, "executorch", 1 << 31)
    io = lambda s: [(t.dtype, t.shape) for t in s.inputs + s.outputs]  # noqa: E731
    if io(a) != io(b):
        return False
    return all(np.array_equal(x, y) for seed in seeds
               for x, y in zip(run_tosa(ours, _seeded(ours, seed)), run_tosa(theirs, _seeded(ours, seed))))


@pytest.mark.parametrize("name,target", CASES)
def test_tosakit_program_for_the_same_quantized_graph(name, target, exported, tmp_path, record_property):
    """ExecuTorch's program and tosakit's for the very graph ExecuTorch quantized, both run by tosakit (delegates
    on the simulator). Where the TOSAs are identical — byte for byte, or computing the same integers (same I/O,
    equal on seeded whole-range inputs) — the outputs must be equal bit for bit; otherwise the difference per
    output is recorded (the TOSAs are different lowerings: the acceptance then rests on the simulator test)."""
    inputs, result = exported(name, target)
    edge = _tosakit_lowering(result, inputs, target)
    ours = [m.tosa for m in edge.program.graph_module.children()
            if isinstance(m, LoweredBackendModule) and m.backend_id == "EthosUBackend"]
    theirs = [Path(d["tosa"]).read_bytes() for d in result["delegates"]]
    identical = len(ours) == len(theirs) and all(a == b for a, b in zip(ours, theirs))
    same = identical or (len(ours) == len(theirs) and all(_same_function(a, b) for a, b in zip(ours, theirs)))
    path = edge.to_executorch().save(tmp_path / f"{name}_tosakit.pte")
    ours_loaded, theirs_loaded = load(path), load(result["pte"])
    (mine, my_steps), (executorch, their_steps) = ours_loaded.run_profiled(inputs), theirs_loaded.run_profiled(inputs)
    _assert_same_stream_same_time(ours_loaded, theirs_loaded, my_steps, their_steps)
    assert len(mine) == len(executorch)
    diffs = []
    for k, (m, e) in enumerate(zip(mine, executorch)):
        assert m.dtype == e.dtype and m.shape == e.shape, (k, m.dtype, m.shape, e.dtype, e.shape)
        off = (m.double() - e.double()).abs()
        diffs.append(f"output {k}: {int((off > 0).sum())} of {off.numel()} differ, max |diff| {float(off.max()):.4g}")
    tosa = ("byte-identical" if identical else "same function on seeded inputs" if same else "different") + \
        f" ({len(ours)} tosakit / {len(theirs)} ExecuTorch delegate(s))"
    record_property("tosa", tosa)
    record_property("outputs", "; ".join(diffs))
    print(f"{name} {target}: TOSA {tosa}; {'; '.join(diffs)}")
    if same:
        for k, (m, e) in enumerate(zip(mine, executorch)):
            assert torch.equal(m, e), f"output {k}: the TOSAs compute the same integers, the programs differ"


def test_executorch_unet_payload_lists_one_of_three_outputs(et_oracle, tmp_path):
    """Pinned: ExecuTorch's unet has a delegate whose TOSA gives three outputs, each a TRANSPOSE to NCHW that
    also feeds its inverse TRANSPOSE inside the graph; Vela 5.2 cancels the pairs and its I/O table then lists
    one output. ExecuTorch writes that payload, calling it with four tensors; tosakit refuses the file. (tosakit's
    own TOSA for the same partition gets all three outputs from Vela.) When this fails, the payload has become
    runnable: move unet into NAMES."""
    module, inputs = MODELS["unet"].factory()
    result = et_oracle.export_ethosu(module.eval(), inputs, tmp_path, name="unet", target=TARGET)
    outputs = [len(check_tosa(Path(d["tosa"]).read_bytes(), "executorch", 1 << 31).outputs)
               for d in result["delegates"]]
    assert 3 in outputs
    with pytest.raises(TosakitError, match=r"delegate \d, EthosUBackend\): the payload has 1 inputs and 1 outputs, "
                                           r"the call passes 4 tensors"):
        load(result["pte"])


@pytest.mark.parametrize("target", TARGETS)
def test_executorch_bundled_mv2_checks_under_tosakit_run_u55_u85(target, exported, capsys):
    """aot_arm_compiler --bundleio's mv2 (quantized, one Ethos-U delegate) checked by `tosakit run` as the Arm
    runner checks it on a board (``check_executorch_bundle``); the line states the error in output steps."""
    _, result = exported("mv2", target)
    bpte = Path(result["pte"]).with_suffix(".bpte")
    program = load(result["pte"])
    from tosakit.runtime.bundled import output_steps

    [step] = output_steps(program.plan())
    from support.bundles import check_executorch_bundle

    assert step and 0 < step < 0.1
    check_executorch_bundle(bpte, capsys, step)
