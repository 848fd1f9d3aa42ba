"""A newcomer's first hour (issue 13): each defect found on another machine, as a test."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from tosakit.cli import main

TOSAKIT = [sys.executable, "-m", "tosakit"]

MLP = """
import torch
torch.manual_seed(0)
class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))
example_inputs = (torch.randn(1, 8),)
"""


def test_closed_pipe_is_quiet():
    """`tosakit models | head -1`: the reader goes away; no traceback, no 'Exception ignored'."""
    proc = subprocess.Popen([*TOSAKIT, "models"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the child writes a byte (its imports take longer)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and err == "", err


@pytest.mark.parametrize("when", [0.15, 0.2, 0.25, 0.3, 0.5, 2.0, "partitioning and lowering"])
def test_ctrl_c_is_one_line_and_exit_130(tmp_path, when):
    """Ctrl-C while starting, importing torch (after a delay in seconds) or compiling (when the progress line
    says so): exit 130, 'interrupted', no traceback, no file. SIGINT is reset to its default in the child: a
    runner that ignores it (a background job) would hand the ignoring on."""
    proc = subprocess.Popen([*TOSAKIT, "compile", "-m", "mv2", "--delegate", "--quantize", "-o", "m.pte"],
                            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    before = b""
    if isinstance(when, str):
        while (line := proc.stderr.readline()) and when.encode() not in line:
            before += line
        before += line
    else:
        time.sleep(when)
    proc.send_signal(signal.SIGINT)
    err = (before + proc.stderr.read()).decode()
    code = proc.wait(timeout=120)
    if code == 0:
        pytest.fail("compile finished before the signal")
    assert code == 130 and "Traceback" not in err and err.strip().splitlines()[-1] == "interrupted", err
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".pte", ".tmp")]


def test_read_only_output_is_refused_before_compiling(tmp_path, monkeypatch, capsys):
    """A folder the user cannot write: one error before the flow starts (root passes permission checks, so
    the test says the folder is read-only through os.access, as a non-root user's system would)."""
    import tosakit.capture
    import tosakit.flow  # noqa: F401  (binds the real export before it is patched)

    (tmp_path / "ro").mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p).endswith("ro") else real(p, mode))
    monkeypatch.setattr(tosakit.capture, "export", lambda *a, **k: pytest.fail("compiled first"))
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "-q", "-m", "add", "-o", "ro/add.pte"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot write ro/add.pte: folder ro is read-only") and "fix:" in err


def test_import_tosakit_then_runtime_load():
    """The README's `import tosakit; tosakit.runtime.load(...)` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", "import tosakit; print(tosakit.runtime.load.__name__, "
                           "tosakit.to_backend.__name__)"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.split() == ["load", "to_backend"], done.stderr


def test_to_backend_as_the_seed_tutorial_writes_it():
    """`graph_module_edge.exported_program = to_backend(model.exported_program, ArmPartitioner(spec))`, then
    the program runs with the delegate's result."""
    from tosakit import ArmPartitioner, TosaCompileSpec, generate_ethosu_compile_spec, to_backend, to_edge
    from tosakit.runtime import LoadedProgram

    class Add(torch.nn.Module):
        def forward(self, x):
            return x + x

    g = torch.Generator().manual_seed(0)
    cases = ((generate_ethosu_compile_spec("ethos-u55-128"), torch.randint(-9, 9, (1, 4), generator=g, dtype=torch.int32)),
             (TosaCompileSpec("TOSA-1.0+FP"), torch.randn(1, 4, generator=g)))
    for spec, x in cases:  # the tutorial's AddModule on int32 for the Ethos-U, as the seed writes it
        graph_module_edge = to_edge(torch.export.export(Add(), (x,)))
        model = graph_module_edge
        graph_module_edge.exported_program = to_backend(model.exported_program, ArmPartitioner(spec))
        assert len(graph_module_edge.delegates) == 1 and callable(graph_module_edge.exported_program)
        program = graph_module_edge.to_executorch()
        if isinstance(spec, TosaCompileSpec):
            [got] = LoadedProgram(program.buffer, "add.pte").run([x])
            assert torch.equal(got, x + x)
    with pytest.raises(Exception, match="to_backend takes an EdgeProgramManager"):
        to_backend("model.pte", ArmPartitioner(TosaCompileSpec("TOSA-1.0+FP")))


# ---------------------------------------------------------------- calibration data


def test_read_calibration_forms(tmp_path):
    """Every documented form gives the same samples, shaped like the example inputs."""
    from tosakit.errors import TosakitError
    from tosakit.quantize.data import read_calibration

    g = torch.Generator().manual_seed(0)
    xs, ys = torch.randn(5, 1, 3, generator=g), torch.randn(5, 2, generator=g)
    example = (torch.zeros(1, 3), torch.zeros(2))
    np.savez(tmp_path / "stacked.npz", arg0=xs.numpy(), arg1=ys.numpy())  # [N, *shape]
    np.savez(tmp_path / "batch.npz", arg1=ys.numpy(), arg0=xs[:, 0].numpy())  # [N, *shape[1:]], names in any order
    torch.save([(x, y) for x, y in zip(xs, ys)], tmp_path / "list.pt")
    torch.save({"arg0": xs, "arg1": ys}, tmp_path / "dict.pt")
    (tmp_path / "folder").mkdir()
    for k in range(5):
        np.savez(tmp_path / "folder" / f"s{k}.npz", arg0=xs[k].numpy(), arg1=ys[k].numpy())
    for name in ("stacked.npz", "batch.npz", "list.pt", "dict.pt", "folder"):
        samples = read_calibration(tmp_path / name, example)
        assert len(samples) == 5, name
        for k, (x, y) in enumerate(samples):
            assert torch.equal(x, xs[k]) and torch.equal(y, ys[k]) and x.shape == (1, 3), name
    np.save(tmp_path / "one.npy", xs.numpy())
    assert len(read_calibration(tmp_path / "one.npy", (torch.zeros(1, 3),))) == 5
    np.savez(tmp_path / "ints.npz", arg0=np.zeros((2, 1, 3), np.int32))
    with pytest.raises(TosakitError, match="input 0 holds int32, the model takes float32"):
        read_calibration(tmp_path / "ints.npz", (torch.zeros(1, 3),))
    np.savez(tmp_path / "uneven.npz", arg0=xs.numpy(), arg1=ys[:2].numpy())
    with pytest.raises(TosakitError, match="different sample counts"):
        read_calibration(tmp_path / "uneven.npz", example)
    (tmp_path / "bad.pt").write_bytes(b"not a pickle")
    with pytest.raises(TosakitError, match="cannot read calibration file"):
        read_calibration(tmp_path / "bad.pt", example)


def test_compile_calibrates_on_given_data_and_verifies_on_other_inputs(tmp_path, monkeypatch, capsys):
    """Without calibration data the program is verified on seeded random inputs, not on the one sample it
    was calibrated on; with --calibration it calibrates on those samples and verifies on the example input;
    the output says which."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mlp.py").write_text(MLP)
    g = torch.Generator().manual_seed(1)
    np.savez(tmp_path / "calib.npz", arg0=torch.randn(32, 8, generator=g).numpy())
    base = ["compile", "-q", "-m", "mlp.py:MLP", "-t", "TOSA-1.0+INT", "--delegate", "--quantize", "--verify"]
    assert main([*base, "-o", "a.pte"]) == 0
    out = capsys.readouterr().out
    assert "calibrated on the example input (one sample: pass --calibration PATH" in out
    assert "verified on seeded random inputs (seed 0, not the calibration sample)" in out
    assert main([*base, "-o", "b.pte", "--calibration", "calib.npz"]) == 0
    out = capsys.readouterr().out
    assert "calibrated on 32 sample(s) from calib.npz" in out
    assert "verified on the example input (not used for calibration)" in out


def test_quantizing_an_integer_model_says_there_is_nothing_to_quantize(tmp_path, monkeypatch, capsys):
    """The tutorial's int32 `add` with --quantize: delegated, verified (integer outputs compared exactly), and
    the output says quantization had nothing to do, instead of an error about capture."""
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "-q", "-m", "add", "--delegate", "--quantize", "--verify", "-t", "TOSA-1.0+INT"]) == 0
    out = capsys.readouterr().out
    assert "1 of 1 compute ops delegated" in out
    assert "calibrated on nothing: the model has no float op to quantize (its inputs are int32)" in out
    assert "0 [5]             float                    0      inf" in out


def test_trained_model_calibrates_on_its_training_data(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["compile", "-q", "-m", "digits", "-t", "TOSA-1.0+INT", "--delegate", "--quantize", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "calibrated on 64 training samples of digits" in out and "verified on the example input (not used" in out


def test_accuracy_takes_calibration_data(tmp_path, monkeypatch, capsys):
    from tosakit.zoo.trained import digits_data

    monkeypatch.chdir(tmp_path)
    np.savez(tmp_path / "c.npz", arg0=digits_data().train_x[:16].numpy())
    assert main(["accuracy", "-m", "digits", "-t", "TOSA-1.0+INT", "--schemes", "int8", "--limit", "20",
                 "--calibration", "c.npz"]) == 0
    assert "calibrated on 16 sample(s) from c.npz" in capsys.readouterr().out


# ---------------------------------------------------------------- trained models, the same everywhere

# sha256 of the trained state (parameters in state_dict order, float32 bytes) and held-out top-1 in float64:
# what every machine computes (checked with 1, 2 and 4 threads and ATen's default and AVX2 kernels)
TRAINED = {
    "digits": ("314a76dfad68", 99.11),
    "waves": ("a79f975e8179", 77.07),
}


@pytest.mark.numerics
@pytest.mark.parametrize("name", list(TRAINED))
def test_trained_models_are_the_same_on_every_machine(name):
    from tosakit.zoo import trained

    model, _ = getattr(trained, name)()
    digest = hashlib.sha1(b"".join(v.numpy().tobytes() for v in model.state_dict().values())).hexdigest()[:12]
    data = getattr(trained, f"{name}_data")()
    assert (digest, round(trained.float_accuracy(model, data), 2)) == TRAINED[name]


# ---------------------------------------------------------------- what the demo judges


def _report(layers_ok: bool, fake_snr: float, float_snr: float):
    from tosakit.verify.report import Agreement, LayerReport, OutputReport, VerifyReport

    a = lambda snr: Agreement(0.1, snr, 0.99, None)  # noqa: E731
    layer = LayerReport("d", "conv", "aten.convolution.default", (1, 4), True, 0.0 if layers_ok else 3.0, None, None)
    return VerifyReport([OutputReport(0, (1, 4), a(float_snr), a(fake_snr))], [layer])


@pytest.mark.parametrize("layers_ok, fake_snr, ok", [(True, float("inf"), True), (True, 25.0, True),
                                                      (False, float("inf"), False), (True, 3.0, False)])
def test_demo_judges_quantized_programs_against_the_fake_quantized_model(layers_ok, fake_snr, ok):
    """Quantization error against float (here 2 dB) is information; a divergent layer or outputs far from
    the fake-quantized model fail."""
    from tosakit.demo import judge

    verdict = judge("p.pte", _report(layers_ok, fake_snr, 2.0), quantized=True)
    assert verdict.ok is ok and "2.0 dB SNR against float" in verdict.information


def test_demo_judges_float_programs_against_float():
    from tosakit.demo import judge

    assert judge("p.pte", _report(True, 0, float("inf")), quantized=False).ok
    assert not judge("p.pte", _report(True, 0, 40.0), quantized=False).ok
