"""Checking ExecuTorch-made BundledPrograms with `tosakit run`."""

from __future__ import annotations

from pathlib import Path


def check_executorch_bundle(bpte: Path, capsys, step: float) -> None:
    """ExecuTorch's .bpte under `tosakit run`: PASS at the tolerance ExecuTorch's Arm tests give quantized models
    (atol 0.25 plus one output step, rtol 0.001), with an error past the runners' default 0.01 (its expected
    outputs are the fake-quantized float model's, whole output steps from any integer engine's: the FVP's too; the
    default's FAIL is tests/program/test_bundled.py's); an expected output moved by 1.0 FAILs, naming the method,
    test case, output and the largest error."""
    from tosakit.cli import main
    from tosakit.program.bundled import deserialize_bundled, serialize_bundled
    from tosakit.runtime.bundled import tensor_of

    tolerance = ["--atol", str(0.25 + step), "--rtol", "0.001"]
    assert main(["run", str(bpte), *tolerance]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert out.rstrip().endswith("Test_result: PASS")
    line = next(ln for ln in out.splitlines() if "method forward, test case 0, output 0 [1, 1000]" in ln)
    assert float(line.split("max |error| ")[1].split()[0]) > 0.01  # the default tolerance fails it
    table = deserialize_bundled(bpte.read_bytes())
    want = table.method_test_suites[0].test_cases[0].expected_outputs[0].val
    moved = tensor_of(want).copy()
    moved[0, 7] += 1.0
    want.data = moved.tobytes()
    (bpte.parent / "altered.bpte").write_bytes(serialize_bundled(table))
    assert main(["run", str(bpte.parent / "altered.bpte"), *tolerance]) == 3
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "method forward, test case 0, output 0 [1, 1000]" in ln)
    assert line.endswith("at [0, 7]: FAIL") and float(line.split("max |error| ")[1].split()[0]) > 0.7, line

