"""BundledProgram (.bpte): the file as ExecuTorch's schema lays it out, `compile --bundleio`, and `tosakit run` of
a bundle: Test_result PASS, or FAIL naming the method, test case, output and largest error (exit 3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tosakit.errors import TosakitError
from tosakit.program.bundled import (BundledProgram, MethodTestCase, MethodTestSuite, deserialize_bundled,
                                     serialize_bundled, serialize_from_bundled_program_to_flatbuffer)
from tosakit.runtime.bundled import tensor_of


class _Program:
    buffer = b"not checked here"


def test_values_keep_their_types_shapes_and_storage_order():
    """A channels-last float tensor is stored in its dim order and read back as it was; int64 tensors, ints,
    floats and bools keep their kinds; the suites are sorted by method, as ExecuTorch sorts them."""
    x = torch.randn(1, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    ids = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    suites = [MethodTestSuite("prefill", [MethodTestCase([ids, 7, 0.5, True], [x])]),
              MethodTestSuite("decode", [MethodTestCase([x], [ids]), MethodTestCase([x * 2], [ids + 1])])]
    table = deserialize_bundled(serialize_from_bundled_program_to_flatbuffer(BundledProgram(_Program(), suites)))
    assert table.version == 2 and table.program == _Program.buffer
    assert [s.method_name for s in table.method_test_suites] == ["decode", "prefill"]
    decode, prefill = table.method_test_suites
    stored = decode.test_cases[0].inputs[0].val
    assert stored.dim_order == [0, 2, 3, 1] and stored.data == x.permute(0, 2, 3, 1).contiguous().numpy().tobytes()
    assert np.array_equal(tensor_of(stored), x.numpy())
    assert np.array_equal(tensor_of(decode.test_cases[1].expected_outputs[0].val), (ids + 1).numpy())
    values = [v.val for v in prefill.test_cases[0].inputs]
    assert np.array_equal(tensor_of(values[0]), ids.numpy())
    assert (values[1].int_val, values[2].double_val, values[3].bool_val) == (7, 0.5, True)


@pytest.mark.parametrize("damage, message", [
    (lambda t: setattr(t.method_test_suites[0].test_cases[0].inputs[0].val, "data", b"\0" * 7),
     r"method 'forward', test case 0, input 0 holds 7 bytes; sizes \[2, 2\] of float32 need 16"),
    (lambda t: setattr(t.method_test_suites[0].test_cases[0].inputs[0].val, "dim_order", [1, 1]),
     r"method .forward., test case 0, input 0 has sizes \[2, 2\] and dim order \[1, 1\]"),
    (lambda t: setattr(t, "version", 3), "schema version 3"),
    (lambda t: setattr(t, "program", b""), "it bundles no program"),
])
def test_a_damaged_bundle_is_refused_naming_the_value(damage, message):
    table = BundledProgram(_Program(), [MethodTestSuite("forward", [MethodTestCase([torch.zeros(2, 2)])])])
    table = table.serialize_to_schema()
    damage(table)
    with pytest.raises(TosakitError, match=f"corrupt .bpte: {message}"):
        deserialize_bundled(serialize_bundled(table))


def test_run_checks_the_bundle_and_fails_an_altered_one(tmp_path, capsys):
    """`compile --bundleio --quantize`: the fake-quantized model's outputs, evaluated exactly, bundled; `run`
    passes it at the runners' default tolerance. An expected output moved by 0.5 fails: exit 3, the line names
    the method, the test case, the output and the largest error."""
    from tosakit.cli import main

    assert main(["compile", "-m", "digits", "--quantize", "--bundleio", "-q", "-o", str(tmp_path / "d.pte")]) == 0
    assert "wrote " + str(tmp_path / "d.bpte") in capsys.readouterr().out
    assert main(["run", str(tmp_path / "d.bpte")]) == 0
    out = capsys.readouterr().out
    assert "method forward, test case 0, output 0 [1, 10]: max |error| 0 at" in out and "Test_result: PASS" in out
    table = deserialize_bundled((tmp_path / "d.bpte").read_bytes())
    want = table.method_test_suites[0].test_cases[0].expected_outputs[0].val
    moved = tensor_of(want).copy()
    moved[0, 3] += 0.5
    want.data = moved.tobytes()
    (tmp_path / "bad.bpte").write_bytes(serialize_bundled(table))
    assert main(["run", str(tmp_path / "bad.bpte")]) == 3
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "method forward, test case 0, output 0 [1, 10]" in ln)
    assert "max |error| 0.5 (" in line and "output steps of" in line and line.endswith("at [0, 3]: FAIL")
    assert out.rstrip().endswith("Test_result: FAIL")
    assert main(["inspect", str(tmp_path / "d.bpte")]) == 0
    assert "case 0: inputs float32[1, 1, 8, 8]; expected outputs float32[1, 10]" in capsys.readouterr().out


def test_a_bundle_is_not_a_program_and_says_so(tmp_path):
    """Loading a .bpte as a .pte names what it is and how to run it."""
    from tosakit.runtime import load

    table = BundledProgram(_Program(), [MethodTestSuite("forward", [MethodTestCase([torch.zeros(1)])])])
    (tmp_path / "x.bpte").write_bytes(serialize_from_bundled_program_to_flatbuffer(table))
    with pytest.raises(TosakitError, match="not a .pte") as caught:
        load(tmp_path / "x.bpte")
    assert "BundledProgram" in caught.value.hint


@pytest.mark.oracle
def test_a_bundle_executorch_wrote_passes_under_tosakit_run_fp(et_oracle, tmp_path, capsys):
    """ExecuTorch's own serializer bundles ExecuTorch's CPU program of a small net with its float outputs;
    `tosakit run` reads the file, runs the test case and passes it at the runners' default tolerance."""
    from tosakit.cli import main

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64, 5))
    inputs = (torch.randn(1, 3, 6, 6, generator=torch.Generator().manual_seed(1)),)
    source = ("import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), "
              "torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64, 5)).eval()\n"
              "example_inputs = (torch.randn(1, 3, 6, 6),)\n")
    pte = et_oracle.export(source, tmp_path / "net.pte")
    with torch.no_grad():
        expected = (net.eval()(*inputs),)
    bpte = et_oracle.bundle(pte, inputs, expected, tmp_path / "net.bpte")
    assert main(["run", str(bpte)]) == 0
    out = capsys.readouterr().out
    assert "method forward, test case 0, output 0 [1, 5]" in out and out.rstrip().endswith("Test_result: PASS")
