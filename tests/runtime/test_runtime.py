"""The host runtime: runs our .pte files and ExecuTorch's, checks inputs, and explains bad files."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from tosakit.cli import main
from tosakit.errors import TosakitError
from tosakit.flow import compile
from tosakit.lower import RULES
from tosakit.lower.lowering import int_dtype
from tosakit.program.pte import deserialize_pte
from tosakit.quantize.qdq import is_dequantize, is_quantize, qparams_of
from tosakit.runtime import evaluate_exact, load, run_tosa
from tosakit.specs import EthosUCompileSpec
from tosakit.verify.layers import layer_reports
from tosakit.verify.run import verify

pytestmark = pytest.mark.numerics

MLP = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10), torch.nn.Softmax(-1)).eval()
example_inputs = (torch.randn(3, 16),)
"""

SOFTMAX = """
import torch
model = torch.nn.Softmax(dim=-1).eval()
example_inputs = (torch.randn(4, 10),)
"""

QUANTIZED_MLP = """
import torch
import executorch.kernels.quantized  # the .out variants of quantize/dequantize
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer, get_symmetric_quantization_config
torch.manual_seed(0)
float_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10)).eval()
example_inputs = (torch.randn(3, 16),)
gm = torch.export.export(float_model, example_inputs).module()
gm = prepare_pt2e(gm, XNNPACKQuantizer().set_global(get_symmetric_quantization_config()))
gm(*example_inputs)
model = convert_pt2e(gm)
"""


def _output_step(pte) -> float:
    """The scale of the last dequantize kernel call of a program (its output's step), 0 without one."""
    from tosakit.program.schema import KernelCall

    program, _ = deserialize_pte(pte.read_bytes())
    plan = program.execution_plan[0]
    calls = [i.instr_args for i in plan.chains[0].instructions if isinstance(i.instr_args, KernelCall)]
    steps = [plan.values[c.args[1]].val.double_val for c in calls
             if "dequantize_per_tensor" in plan.operators[c.op_index].name]
    return steps[-1] if steps else 0.0


@pytest.mark.oracle
@pytest.mark.parametrize("source", [SOFTMAX, MLP, QUANTIZED_MLP], ids=["softmax", "mlp", "quantized_mlp"])
def test_runs_executorch_programs_like_executorch(source, tmp_path, et_oracle):
    """Float outputs to 1e-6; dequantized ones within one output step, not exactly: the two runtimes' float
    kernels sum in other orders, so a value on a rounding tie may land one step apart (a wrong kernel or
    quantization parameter is off by many steps)."""
    pte = et_oracle.export(source, tmp_path / "et.pte")
    program = load(pte)
    inputs = [torch.randn(*s.shape, generator=torch.Generator().manual_seed(7)) for s in program.input_specs()]
    ours = program.run(inputs)
    theirs = et_oracle.run(pte, inputs)
    assert len(ours) == len(theirs)
    step = _output_step(pte)
    assert (step > 0) == (source is QUANTIZED_MLP)
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o.numpy(), t, atol=max(1e-6, step * 1.001), rtol=0)


@pytest.mark.oracle
def test_runs_our_cpu_programs_like_executorch(tmp_path, program_check):
    """Float: to 1e-6. Quantized: the whole program runs in both and agrees in kind, and each layer, fed the
    reference's integers, is within one step in ExecuTorch (``ProgramCheck.layers``): whole-program integers
    would hinge on the runtimes' float kernels summing in one order."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5)).eval()
    inputs = (torch.randn(1, 3, 8, 8),)
    for quantize in (False, True):
        compiled = compile(model, inputs, "ethos-u55-128", quantize=quantize, delegate=False)
        path = tmp_path / f"cpu_{quantize}.pte"
        compiled.program.save(path)
        [ours] = load(path).run(inputs)
        [theirs] = program_check.oracle.run(path, inputs)
        if not quantize:
            np.testing.assert_allclose(ours.numpy(), theirs, atol=1e-6, rtol=0)
        else:
            assert ours.shape == theirs.shape and ours.dtype == torch.from_numpy(theirs).dtype
            assert program_check.layers(compiled, inputs) >= 3


@pytest.mark.slow
def test_mv2_on_ethos_u55_runs_bit_for_bit(tmp_path):
    """`tosakit run` of the delegated MobileNetV2: the delegate's int8 results are those of its TOSA on
    the reference model, and the outputs are the fake-quantized model's (evaluated exactly)."""
    from tosakit.zoo.mobilenet_v2 import build

    model, inputs = build()
    compiled = compile(model, inputs, EthosUCompileSpec("ethos-u55-128").with_debug_info(), quantize=True)
    path = tmp_path / "mv2_arm_delegate_ethos-u55-128.pte"
    compiled.program.save(path)
    [x] = inputs  # the calibration input: end to end, the network amplifies no rounding flip here
    [out] = load(path).run([x])

    gm = compiled.edge.program.graph_module
    q_in = qparams_of(next(n for n in gm.graph.nodes if is_quantize(n)))
    dq_out = next(n for n in gm.graph.nodes if is_dequantize(n))
    [module] = [m for m in gm.children() if hasattr(m, "tosa")]
    [int8] = run_tosa(module.tosa, [q_in.quantize(x).numpy()])
    assert torch.equal(out, qparams_of(dq_out).dequantize(torch.from_numpy(int8)))
    [fake_quant] = evaluate_exact(compiled.quantized, x)
    step = qparams_of(dq_out).s
    assert float((out - fake_quant).abs().max()) <= step * 1.001
    # on any input, every layer stays within one step of the fake-quantized layer fed the same values
    other = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(5))
    layers = layer_reports(compiled.edge, (other,), None)
    assert len(layers) > 60 and all(layer.steps_off is not None and layer.steps_off <= 1 for layer in layers)


def _cli(capsys, *args) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def small_pte(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))
    spec = EthosUCompileSpec("ethos-u85-256").with_debug_info()
    compiled = compile(model.eval(), (torch.randn(1, 3, 10, 10),), spec, quantize=True)
    path = folder / "small.pte"
    compiled.program.save(path)
    return path


def test_run_and_inspect_commands(small_pte, tmp_path, capsys):
    code, out, _ = _cli(capsys, "run", str(small_pte), "--random", "--outputs", str(tmp_path / "o.npz"))
    assert code == 0 and "output 0: float32[1, 4]" in out
    assert np.load(tmp_path / "o.npz")["out0"].shape == (1, 4)
    np.savez(tmp_path / "in.npz", arg0=np.random.randn(1, 3, 10, 10).astype(np.float32))
    assert _cli(capsys, "run", str(small_pte), "--inputs", str(tmp_path / "in.npz"))[0] == 0
    code, out, _ = _cli(capsys, "inspect", str(small_pte))
    assert code == 0
    for words in ("inputs:  float32[1, 3, 10, 10]", "delegate 0: EthosUBackend", "tosa_spec = TOSA-1.0+INT+int16+int4+cf",
                  "Ethos-U payload blocks: vela_bin_stream 0, cmd_data", "scratch:", "carried (--debug-info)"):
        assert words in out, words


def test_a_files_sandbox_is_kept_across_runs_and_replaced_after_a_crash(small_pte):
    """A file's delegates run in one child process for all its runs (one per run cost 0.1 to 0.8 s each: the
    digits program's 100 runs took 80 s); a child that died is replaced on the next run."""
    import os
    import signal

    program = load(small_pte)
    x = torch.randn(1, 3, 10, 10)
    first = program.run([x])[0]
    [child] = program._children.values()
    assert torch.equal(program.run([x])[0], first) and list(program._children.values()) == [child]
    os.kill(child.proc.pid, signal.SIGKILL)
    child.proc.wait()
    assert torch.equal(program.run([x])[0], first)
    [again] = program._children.values()
    assert again is not child and again.proc.poll() is None
    pid = again.proc.pid
    del program, again  # the child ends with its program (subprocess alone would keep it, its pipe open)
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_run_and_inspect_start_without_the_compile_flow(small_pte):
    """`tosakit run` and `inspect` of a file import no compile stage (torchao's quantization pulled in
    torch._dynamo: 4.6 s and 90 MB before the first kernel ran)."""
    import subprocess
    import sys

    probe = ("import sys\nfrom tosakit.cli import main\n"
             f"assert main(['run', {str(small_pte)!r}, '--random']) == 0\n"
             f"assert main(['inspect', {str(small_pte)!r}]) == 0\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torchao' or m.startswith(("
             "'tosakit.quantize', 'tosakit.partition', 'tosakit.lower.passes', 'tosakit.program.manager'))))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout[-2000:]


def _damaged(small_pte, tmp_path):
    data = small_pte.read_bytes()
    root = int.from_bytes(data[:4], "little")
    cases = {
        "truncated.pte": data[: len(data) // 2],
        "identifier.pte": data[:4] + b"XX12" + data[8:],
        "corrupt.pte": data[:root] + bytes(64) + data[root + 64:],
        "empty.pte": b"",
    }
    for name, blob in cases.items():
        (tmp_path / name).write_bytes(blob)
    return cases


@pytest.mark.parametrize("name, words", [
    ("truncated.pte", ["truncated"]),
    ("identifier.pte", ["XX12", "ET12"]),
    ("corrupt.pte", ["corrupt"]),
    ("empty.pte", ["empty.pte"]),
])
def test_bad_files_are_clear_errors(small_pte, tmp_path, capsys, name, words):
    _damaged(small_pte, tmp_path)
    code, _, err = _cli(capsys, "run", str(tmp_path / name), "--random")
    assert code == 2 and err.startswith("error: ") and "Traceback" not in err
    for w in words:
        assert w in err, err


@pytest.mark.parametrize("arrays, words", [
    ({"arg0": np.zeros((1, 3, 9, 9), np.float32)}, ["input 0", "float32[1, 3, 10, 10]", "float32[1, 3, 9, 9]"]),
    ({"arg0": np.zeros((1, 3, 10, 10), np.int32)}, ["input 0", "int32[1, 3, 10, 10]"]),
    ({}, ["holds 0 array(s)", "takes 1"]),
    ({"arg0": np.zeros((1, 3, 10, 10), np.float32), "arg1": np.zeros(2, np.float32)}, ["holds 2 array(s)"]),
])
def test_bad_inputs_are_clear_errors(small_pte, tmp_path, capsys, arrays, words):
    np.savez(tmp_path / "in.npz", **arrays)
    code, _, err = _cli(capsys, "run", str(small_pte), "--inputs", str(tmp_path / "in.npz"))
    assert code == 2 and err.startswith("error: "), err
    for w in words:
        assert w in err, err


def test_delegates_without_tosa_say_how_to_get_it(tmp_path):
    """An Ethos-U55 payload runs on the simulator without its TOSA; the tosa engine needs --debug-info."""
    compiled = compile(nn.Linear(4, 4).eval(), (torch.randn(1, 4),), "ethos-u55-128", quantize=True)
    path = tmp_path / "plain.pte"
    compiled.program.save(path)
    assert load(path).run([torch.randn(1, 4)])[0].shape == (1, 4)
    with pytest.raises(TosakitError, match=r"delegate 0 \(EthosUBackend\) has no TOSA graph(.|\n)*--debug-info"):
        load(path, engine="tosa").run([torch.randn(1, 4)])


def test_program_reader_round_trips(small_pte):
    from tosakit.program.pte import serialize_pte

    data = small_pte.read_bytes()
    program, segments = deserialize_pte(data)
    again = serialize_pte(program, segments)
    assert deserialize_pte(again) == (program, segments)


class ThreeConvs(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.c = nn.Conv2d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def test_verify_names_a_broken_layer_first(monkeypatch):
    """Inject a lowering bug into one convolution: the per-layer table points at it."""
    model, inputs = ThreeConvs().eval(), (torch.randn(1, 3, 12, 12),)
    rule = RULES[torch.ops.aten.convolution.default]
    original = rule.lower

    def broken(ctx, node):
        v = original(ctx, node)
        if node.name == "convolution_1":  # scale the middle layer's result by 1.25 around its zero point
            v = ctx.rescale(v, 1.25, int_dtype(v.q), v.q.zp, v.q.zp, q=v.q)
        return v

    monkeypatch.setitem(RULES, torch.ops.aten.convolution.default, type(rule)(rule.target, broken, rule.support))
    compiled = compile(model, inputs, "ethos-u55-128", quantize=True)
    report = verify(compiled.edge, compiled.program, inputs, model, compiled.quantized, layers=True)
    first = report.first_divergent_layer
    assert first is not None and first.node == "convolution_1", report.table()
    assert [layer.node for layer in report.layers if layer.node.startswith("convolution")][0] == "convolution"
    assert report.outputs[0].vs_fake_quant.max_abs_error > 0
    assert "first divergent from the fake-quantized model: convolution_1" in report.table()


def test_verify_table_columns_stay_aligned_for_long_output_shapes():
    """An output shape wider than the first column ([1, 1000, 1024, 16]) widens it: every row's reference, error
    and SNR columns start where the header's do (they were pushed right by the shape)."""
    from tosakit.verify.report import Agreement, OutputReport, VerifyReport

    a = Agreement(0.01, 40.0, 0.9999, None)
    report = VerifyReport([OutputReport(0, (1, 1000, 1024, 16), a, a), OutputReport(1, (1, 4), a, a)], [])
    header, *rows = report.table().splitlines()[:5]
    for row in rows:
        assert row.index("float" if "float" in row else "fake-quant") == header.index("reference"), (header, row)
        assert len(row) == len(header), (header, row)


def test_verify_never_says_every_layer_matches_when_the_outputs_do_not():
    """Layers each one step off given the same inputs can add up to outputs far apart (an RMS norm's mean of
    squares before its rsqrt): the line says the outputs differ and names the layers that round differently."""
    from tosakit.verify.report import Agreement, LayerReport, OutputReport, VerifyReport

    def layer(name, steps):
        return LayerReport("lowered_module_0", name, "aten.mean.dim", (1, 32, 1), True, steps, None, None)

    apart = Agreement(0.0996, 27.8, 0.999, None)
    report = VerifyReport([OutputReport(0, (1, 32, 1024), None, apart)], layers=[layer("mean", 1), layer("mul", 0)])
    assert report.first_divergent_layer is None
    text = report.table()
    assert "every layer matches" not in text
    assert "the outputs differ from the fake-quantized model (max |err| 0.0996)" in text and "(mean)" in text
    report.outputs[0].vs_fake_quant = Agreement(0.0, math.inf, 1.0, None)
    assert "every layer matches the fake-quantized model" in report.table()


def test_verify_reports_agreement_for_a_correct_program():
    model, inputs = ThreeConvs().eval(), (torch.randn(1, 3, 12, 12),)
    compiled = compile(model, inputs, "ethos-u85-256", quantize=True)
    report = verify(compiled.edge, compiled.program, inputs, model, compiled.quantized, layers=True)
    assert report.first_divergent_layer is None
    [out] = report.outputs
    assert out.vs_fake_quant.max_abs_error == 0 and out.vs_fake_quant.cosine == pytest.approx(1.0)
    assert 10 < out.vs_float.snr_db < 80
    assert all(layer.vs_float is not None for layer in report.layers if layer.target.endswith("convolution.default"))


class TokenEncoder(nn.Module):
    """BERT's shape in small: int64 token ids, an embedding, a layer norm with a tiny epsilon, masked attention."""

    def __init__(self):
        super().__init__()
        self.embed, self.norm = nn.Embedding(50, 16), nn.LayerNorm(16, eps=1e-12)
        self.q, self.k = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, ids):
        x = self.norm(self.embed(ids))
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / 4
        mask = torch.ones(8, 8, dtype=torch.bool).tril()
        return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ x


def test_every_layer_of_a_token_model_is_compared_with_float():
    """int64 ids (cast to int32 for the delegate) and constants that quantize to the same integers as several
    float ones (zero, a norm's epsilon) still pair every layer with its float twin: the per-layer SNR against
    float is shown for each (for BERT it was '-' on every layer), and the last layer's is the output's."""
    model = TokenEncoder().eval()
    inputs = (torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(1)),)
    compiled = compile(model, inputs, "ethos-u85-256", quantize=True)
    verify_on = (torch.randint(0, 50, (1, 8), generator=torch.Generator().manual_seed(2)),)
    report = verify(compiled.edge, compiled.program, verify_on, model, compiled.quantized, layers=True)
    computing = [layer for layer in report.layers if layer.integer]
    assert computing and all(layer.vs_float is not None for layer in computing), \
        [layer.node for layer in computing if layer.vs_float is None]
    [out] = report.outputs
    assert report.layers[-1].vs_float.snr_db == pytest.approx(out.vs_float.snr_db, abs=0.05)


@pytest.mark.parametrize("target", ["TOSA-1.0+INT", "TOSA-1.0+FP", "vgf", "ethos-u55-128"])
def test_every_backend_runs_on_the_host(target, tmp_path):
    """TOSABackend from its payload; VGF and Ethos-U from the TOSA carried with --debug-info."""
    from tosakit.runtime import run_edge
    from tosakit.specs import compile_spec_for_target

    model, inputs = ThreeConvs().eval(), (torch.randn(1, 3, 12, 12),)
    spec = compile_spec_for_target(target).with_debug_info()
    compiled = compile(model, inputs, spec, quantize=spec.tosa_spec.support_integer())
    path = tmp_path / "m.pte"
    compiled.program.save(path)
    [got] = load(path).run(list(inputs))
    [want] = run_edge(compiled.edge, *inputs)
    assert torch.equal(got, want)


def test_failing_kernel_call_names_the_call_not_its_tensors(tmp_path, capsys):
    """A kernel that rejects its arguments is one `error:` line naming the instruction, the kernel and the
    arguments' kinds; never the tensors' values."""
    from tosakit.program.pte import serialize_pte
    from tosakit.program.schema import Int

    compiled = compile(nn.Softmax(dim=-1).eval(), (torch.randn(64, 64),), "TOSA-1.0+FP", delegate=False)
    program, segments = deserialize_pte(compiled.program.buffer)
    plan = program.execution_plan[0]
    [call] = [i.instr_args for i in plan.chains[0].instructions]
    dim = next(i for i in call.args if isinstance(plan.values[i].val, Int))
    plan.values[dim].val = Int(5)  # softmax over a dimension a 2-D tensor does not have
    (tmp_path / "bad.pte").write_bytes(serialize_pte(program, segments))
    code, _, err = _cli(capsys, "run", str(tmp_path / "bad.pte"), "--random")
    assert code == 2 and err.startswith("error: ") and err.count("\n") <= 2, err
    for words in ("instruction 0", "aten::_softmax.out", "float32[64, 64], 5", "Dimension out of range"):
        assert words in err, err
    assert "tensor(" not in err and len(err) < 600
