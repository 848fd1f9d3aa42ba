"""The direct Cortex-M flow against ExecuTorch 1.5.1's (its CortexMQuantizer and CortexMPassManager, in the oracle
env): for the very quantized graph ExecuTorch lowered, tosakit's program calls the same cortex_m:: kernels in the
same order with equal integer arguments, constants and scratch sizes, on a core of each instruction-set class; and
tosakit's runtime gives the same outputs for both programs, close to the float model."""

from __future__ import annotations

import re

import pytest
import torch
from torch.fx import Node

from tosakit.backends.cortex_m.scratch import scratch_buffer
from tosakit.capture import export
from tosakit.capture.graph import graph_attr
from tosakit.flow import compile
from tosakit.runtime import LoadedProgram, load
from tosakit.program.pte import tosa_key
from tosakit.runtime.cpu_cycles import cpu_cycles

pytestmark = [pytest.mark.oracle, pytest.mark.slow]


class ConvBlock(torch.nn.Module):
    """Convolution with a fused ReLU, a depthwise convolution, a residual add, a flatten and a classifier."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = torch.nn.Conv2d(8, 8, 1)
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x, y):
        a = torch.relu(self.conv(x))
        a = self.pw(self.dw(a)) + y
        return self.fc(torch.flatten(a * a, 1))


class PoolNet(torch.nn.Module):
    """Max pooling after a fused ReLU, an average pool, a global mean and a classifier."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.pool, self.avg = torch.nn.MaxPool2d(2), torch.nn.AvgPool2d(2)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x, y):
        a = self.pool(torch.relu(self.conv(x)))
        a = self.avg(self.conv2(a) + y)
        return self.fc(a.mean((2, 3)))


class Scores(torch.nn.Module):
    """Attention's two batch matmuls: scores of queries against keys (a transpose), then the scores times values."""

    def forward(self, q, k):
        return torch.bmm(torch.bmm(q, k.transpose(1, 2)), k)


class Upsample(torch.nn.Module):
    """Transposed convolutions: few input channels (CMSIS-NN's row kernel), then more than 16 (its reversed
    convolution)."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(4, 20, 2, stride=2)
        self.up2 = torch.nn.ConvTranspose2d(20, 3, 3, stride=2, padding=1)

    def forward(self, x, y):
        return self.up2(torch.relu(self.up(x)))


class Classifier(torch.nn.Module):
    """A linear classifier's probabilities over the last dimension."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x, y):
        return torch.softmax(self.fc(x), dim=-1)


class Ratio(torch.nn.Module):
    """A division of two tensors (no CMSIS-NN kernel divides: quantized_div divides in float)."""

    def forward(self, x, y):
        return x / torch.sigmoid(y)


class Extrema(torch.nn.Module):
    """The elementwise minimum and maximum of two tensors (the quantizer gives all three the same qparams)."""

    def forward(self, x, y):
        return torch.minimum(x, y) + torch.maximum(x, y)


NETS = {"ratio": (Ratio, ((1, 4, 16), (1, 4, 16))), "extrema": (Extrema, ((1, 8, 4, 4), (1, 8, 4, 4))), "conv_block": (ConvBlock, ((1, 3, 6, 6), (1, 8, 6, 6))), "pool_net": (PoolNet, ((1, 3, 12, 12), (1, 8, 6, 6))),
        "scores": (Scores, ((2, 4, 8), (2, 5, 8))), "upsample": (Upsample, ((1, 4, 5, 5), (1, 1, 1, 1))),
        "classifier": (Classifier, ((1, 4, 16), (1, 1)))}


def _calls(gm) -> list[tuple[str, list]]:
    """Each cortex_m call of tosakit's edge graph: (op, arguments: values, constant tensors, scratch sizes)."""
    def value(a):
        if isinstance(a, Node):
            if a.op == "get_attr":
                return graph_attr(gm, a)
            return ("scratch", a.args[0]) if a.target is scratch_buffer else "node"
        return [value(x) for x in a] if isinstance(a, (list, tuple)) else a
    return [(str(n.target).split(".")[1], [value(a) for a in n.args]) for n in gm.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("cortex_m.")]


def _their_calls(result) -> list[tuple[str, list]]:
    constants = torch.load(result["constants"])

    def value(a):
        if isinstance(a, dict):
            return constants[a["constant"]] if "constant" in a else ("scratch", a["scratch"]) if "scratch" in a \
                else "node"
        return [value(x) for x in a] if isinstance(a, list) else a
    return [(c["op"], [value(a) for a in c["args"]]) for c in result["calls"]]


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and \
            a.shape == b.shape and torch.equal(a.contiguous(), b.contiguous())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, str) and isinstance(b, str) and a.startswith("torch."):
        return a == b
    return (str(a) == b) if isinstance(a, torch.dtype) else a == b


CORES = ["cortex-m55", "cortex-m33", "cortex-m0"]  # one core of each instruction-set class: MVE, DSP, SCALAR


@pytest.mark.parametrize("net", sorted(NETS))
def test_same_kernels_and_arguments_as_executorch_int(net, et_oracle, tmp_path):
    """On a core of each class, from the one quantized graph ExecuTorch's flow made."""
    torch.manual_seed(0)
    factory, shapes = NETS[net]
    model = factory().eval().to(memory_format=torch.channels_last)
    inputs = tuple(torch.randn(shape) for shape in shapes)
    inputs = tuple(x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x for x in inputs)
    result = et_oracle.cortex_m_export(model, inputs, tmp_path, target=CORES)
    graph = torch.export.load(result["quantized"]).module(check_guards=False)
    float_out = model(*inputs)
    for target in CORES:
        compiled = compile(export(graph, inputs), inputs, target)
        ours, theirs = _calls(compiled.edge.program.graph_module), _their_calls(result["targets"][target])
        assert [op for op, _ in ours] == [op for op, _ in theirs], target
        assert {"conv_block": {"quantized_conv2d", "quantized_depthwise_conv2d", "quantized_add", "quantized_mul",
                               "quantized_linear"},
                "pool_net": {"quantized_max_pool2d", "quantized_avg_pool2d", "pad"},
                "scores": {"quantized_batch_matmul", "transpose"},
                "upsample": {"quantized_transpose_conv2d"},
                "classifier": {"quantized_linear", "softmax"}, "ratio": {"quantized_div"},
                "extrema": {"minimum", "maximum", "quantized_add"}}[net] <= {op for op, _ in ours}
        for (op, mine), (_, their) in zip(ours, theirs):
            assert len(mine) == len(their), (target, op)
            for k, (m, t) in enumerate(zip(mine, their)):
                assert _equal(m, t), (target, op, k, m, t)
        (tmp_path / f"{target}.pte").write_bytes(compiled.program.buffer)
        got = load(tmp_path / f"{target}.pte").run(list(inputs))
        want = load(result["targets"][target]["pte"]).run(list(inputs))  # ExecuTorch's program, on tosakit's runtime
        assert len(got) == len(want) == 1 and torch.equal(got[0], want[0]), target
        assert float((got[0] - float_out).abs().max()) < 0.1 * float(float_out.abs().max())


def test_cortex_m_cores_name_their_kernel_class():
    """Each core runs the CMSIS-NN kernels of its instruction set (ExecuTorch's table); a lesser class may be chosen
    for a core built without its extension, a greater one is refused with the choices."""
    from tosakit.errors import TosakitError
    from tosakit.specs import CortexMCompileSpec, compile_spec_for_target

    assert {t: compile_spec_for_target(t).isa for t in ("cortex-m0", "cortex-m33", "cortex-m55", "Cortex-M85")} == {
        "cortex-m0": "SCALAR", "cortex-m33": "DSP", "cortex-m55": "MVE", "Cortex-M85": "MVE"}
    assert CortexMCompileSpec("cortex-m55", isa="DSP").isa == "DSP"
    with pytest.raises(TosakitError, match="cortex-m4 cannot run MVE kernels: it runs SCALAR, DSP"):
        CortexMCompileSpec("cortex-m4", isa="MVE")
    with pytest.raises(TosakitError, match="cortex-m99"):
        CortexMCompileSpec("cortex-m99")


def test_compile_for_cortex_m55_leaves_no_float_convolution(tmp_path, capsys):
    """`tosakit compile -t cortex-m55 --quantize` of resnet8: every convolution, residual add, the pool and the
    classifier are cortex_m:: kernels; the program runs on the host close to the float model; the user's model
    stays NCHW."""
    from tosakit.cli import main
    from tosakit.zoo import MODELS

    assert main(["compile", "-m", "resnet8", "-t", "cortex-m55", "--quantize", "-o", str(tmp_path / "r8.pte")]) == 0
    out = capsys.readouterr().out
    assert re.search(r"CPU kernels of forward on cortex-m55: [\d,]+ cycles estimated, [\d.]+ ms at 400 MHz\n", out)
    assert "cpu: convolution (aten.convolution.default): no delegation requested (no partitioner) -> " \
           "cortex_m::quantized_conv2d (quantized_conv2d_default)\n" in out
    assert "cpu: view (aten.view.default): no delegation requested (no partitioner) -> portable view\n" in out
    assert "cpu: quantize_per_tensor" not in out and "cpu: dequantize_per_tensor" not in out  # taken in by kernels
    kernels = out.split("CPU kernels: ")[1].splitlines()[0].split(", ")
    assert {"cortex_m::quantized_conv2d.out", "cortex_m::quantized_add.out", "cortex_m::quantized_avg_pool2d.out",
            "cortex_m::quantized_linear.out"} <= set(kernels)
    assert not set(kernels) - DATA_MOVES - {k for k in kernels if k.startswith("cortex_m::")}
    model, inputs = MODELS["resnet8"].factory()
    got = load(tmp_path / "r8.pte").run(list(inputs))[0]
    want = model.eval()(*inputs)
    assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), 0) > 0.9
    block = ConvBlock().eval()
    compile(block, (torch.randn(1, 3, 6, 6), torch.randn(1, 8, 6, 6)), "cortex-m55", quantize=True)
    assert block.conv.weight.is_contiguous()  # compiled from a channels-last copy


# The networks ExecuTorch validates its Cortex-M backend on, but mv3 (its hardswish is a table here, minimum and
# mul there: test_mv3_leaves_no_compute_to_portable_kernels).
ZOO = ["deep_autoencoder", "ds_cnn", "mobilenet_v1_025", "mv2", "resnet8"]
DATA_MOVES = {"aten::view_copy.out", "aten::clone.out", "dim_order_ops::_clone_dim_order.out"}
# ExecuTorch with CMSIS-NN on an Alif E8's Cortex-M55 at 400 MHz, milliseconds (issue 35 quotes them).
ALIF_E8_MS = {"ds_cnn": 5.82, "resnet8": 15.23, "mobilenet_v1_025": 21.75, "deep_autoencoder": 1.21}


@pytest.mark.parametrize("name", ZOO)
def test_zoo_network_as_executorch_lowers_it_int(name, et_oracle, tmp_path):
    """For the quantized graph ExecuTorch's flow makes of the network, tosakit's cortex-m55 program: the same
    kernels with equal arguments, no compute left to portable kernels, equal outputs on tosakit's runtime, and a
    .pte and planned arena no larger than ExecuTorch's."""
    from tosakit.flow import channels_last
    from tosakit.zoo import MODELS

    model, inputs = MODELS[name].factory()
    model, inputs = channels_last(model.eval(), inputs)
    result = et_oracle.cortex_m_export(model, inputs, tmp_path, target="cortex-m55", name=name)
    graph = torch.export.load(result["quantized"]).module(check_guards=False)
    compiled = compile(export(graph, inputs), inputs, "cortex-m55")
    ours, theirs = _calls(compiled.edge.program.graph_module), _their_calls(result)
    assert [op for op, _ in ours] == [op for op, _ in theirs]
    assert not [(op, k) for (op, mine), (_, their) in zip(ours, theirs) for k, (m, t) in enumerate(zip(mine, their))
                if not _equal(m, t)]
    (tmp_path / "tosakit.pte").write_bytes(compiled.program.buffer)
    mine, executorch = load(tmp_path / "tosakit.pte"), load(result["pte"])
    operators = {o.name + (f".{o.overload}" if o.overload else "") for o in mine.plan().operators}
    assert not {o for o in operators if not o.startswith("cortex_m::")} - DATA_MOVES, operators
    got, want = mine.run(list(inputs)), executorch.run(list(inputs))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert all(torch.equal(g, w) for g, w in zip(want, torch.load(result["reference"])))  # its reference kernels
    assert len(compiled.program.buffer) <= (tmp_path / f"{name}.pte").stat().st_size
    assert sum(mine.plan().non_const_buffer_sizes) <= sum(executorch.plan().non_const_buffer_sizes)
    estimated, theirs_estimated = cpu_cycles(mine.plan(), "cortex-m55"), cpu_cycles(executorch.plan(), "cortex-m55")
    assert not estimated.unknown and [c.estimate for c in estimated.calls if c.kernel.startswith("cortex_m::")] == \
        [c.estimate for c in theirs_estimated.calls if c.kernel.startswith("cortex_m::")]  # data moves may differ
    if name in ALIF_E8_MS:  # the published Cortex-M55 figures (bench/cortex_m.py prints them side by side)
        assert abs(estimated.milliseconds(estimated.total) / ALIF_E8_MS[name] - 1) < 0.3


class DilatedTail(torch.nn.Module):
    """A convolution Ethos-U55 takes, then one it refuses (stride 4 with dilation 3)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.tail = torch.nn.Conv2d(8, 8, 5, stride=4, dilation=3, padding=6)

    def forward(self, x):
        return self.tail(torch.relu(self.conv(x)))


def test_cortex_m55_fallback_runs_what_ethos_u55_refuses_u55(tmp_path, capsys):
    """`--delegate --cortex-m55-fallback` on ethos-u55-128: the refused convolution and the boundary quantize and
    dequantize are cortex_m:: kernels (float portable ones without the flag); both programs run on the host and
    agree within one output step of the convolution (CMSIS-NN rounds twice, the float kernel once)."""
    from tosakit.flow import quantize_model
    from tosakit.quantize.qdq import is_quantize, qparams_of
    from tosakit.specs import EthosUCompileSpec

    torch.manual_seed(0)
    model, inputs = DilatedTail().eval(), (torch.randn(1, 3, 32, 32),)
    quantized = export(quantize_model(model, inputs, EthosUCompileSpec("ethos-u55-128")), inputs)
    plain = compile(quantized, inputs, EthosUCompileSpec("ethos-u55-128"))
    fallback = compile(quantized, inputs, EthosUCompileSpec("ethos-u55-128").with_cortex_m_fallback("cortex-m55"))
    kernels = {str(n.target) for n in fallback.edge.program.graph_module.graph.nodes if n.op == "call_function"}
    assert {"cortex_m.quantized_conv2d.default", "cortex_m.quantize_per_tensor.default",
            "cortex_m.dequantize_per_tensor.default"} <= kernels and "aten.convolution.default" not in kernels
    assert "aten.convolution.default" in {str(n.target) for n in plain.edge.program.graph_module.graph.nodes}
    refused = [p for p in fallback.edge.placements if p.target == "aten.convolution.default" and p.placement == "cpu"]
    assert len(refused) == 1 and refused[0].reason and refused[0].kernel.startswith("cortex_m::quantized_conv2d (")
    assert {p.kernel for p in fallback.edge.placements if p.placement == "cpu" and "quantize" in p.target} >= {
        "cortex_m::quantize_per_tensor", "cortex_m::dequantize_per_tensor"}
    outs = []
    for name, compiled in (("plain", plain), ("fallback", fallback)):
        (tmp_path / f"{name}.pte").write_bytes(compiled.program.buffer)
        outs.append(load(tmp_path / f"{name}.pte").run(list(inputs))[0])
    step = qparams_of([n for n in quantized.graph.nodes if is_quantize(n)][-1]).s
    assert float((outs[0] - outs[1]).abs().max()) <= step * 1.01


class Upscale(torch.nn.Module):
    """Issue 35's examples of layers Ethos-U55 refuses in ExecuTorch: a transposed convolution of stride 4, an
    average pool of stride 5."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.up = torch.nn.ConvTranspose2d(8, 8, 4, stride=4)
        self.pool = torch.nn.AvgPool2d(5, stride=5)

    def forward(self, x):
        return self.pool(self.up(torch.relu(self.conv(x))))


def test_what_executorch_leaves_to_the_cortex_m55_runs_on_ethos_u55_here_u55(tmp_path):
    """tosakit's Ethos-U55 lowering takes the stride-4 transposed convolution (as sub-pixel convolutions) and the
    stride-5 average pool: with the fallback, nothing computes on the CPU but the boundary quantize and dequantize,
    cortex_m:: kernels; the NPU's stream equals its TOSA on the reference model."""
    from tosakit.specs import EthosUCompileSpec

    torch.manual_seed(0)
    inputs = (torch.randn(1, 3, 16, 16),)
    compiled = compile(Upscale().eval(), inputs, EthosUCompileSpec("ethos-u55-128").with_cortex_m_fallback(
        "cortex-m55"), quantize=True)
    assert not [p for p in compiled.edge.placements if p.placement == "cpu" and p.compute]
    ops = [str(n.target) for n in compiled.edge.program.graph_module.graph.nodes if n.op == "call_function"]
    assert ops[0] == "cortex_m.quantize_per_tensor.default" and ops[-1] == "cortex_m.dequantize_per_tensor.default"
    (tmp_path / "u.pte").write_bytes(compiled.program.buffer)
    _, comparisons = load(tmp_path / "u.pte", tosa={tosa_key(m.processed_bytes): m.tosa for m in
                                                    compiled.edge.program.graph_module.children()
                                                    if hasattr(m, "processed_bytes")}).run_and_compare(list(inputs))
    assert comparisons and all(c.bit_exact for c in comparisons)


def test_cortex_m_fallback_needs_an_ethos_u_delegate(tmp_path, capsys):
    from tosakit.cli import main

    assert main(["compile", "-m", "add", "-t", "cortex-m55", "--cortex-m55-fallback", "-o",
                 str(tmp_path / "a.pte")]) == 2
    err = capsys.readouterr().err
    assert "--cortex-m-fallback runs what an Ethos-U delegate leaves on the CPU" in err and "fix:" in err
    assert main(["compile", "-m", "add", "--delegate", "--cortex-m-fallback", "cortex-m9", "-o",
                 str(tmp_path / "a.pte")]) == 2
    assert "cortex-m9" in capsys.readouterr().err and not (tmp_path / "a.pte").exists()


class Activations(torch.nn.Module):
    """Element-wise functions between quantized tensors: hardswish and hardsigmoid (decomposed by torch into add,
    clamp, mul and div), sigmoid, a product with a quantized constant, GELU, tanh."""

    def forward(self, x):
        a = torch.nn.functional.hardsigmoid(torch.sigmoid(torch.nn.functional.hardswish(x)) * 0.5)
        return torch.tanh(torch.nn.functional.gelu(a) * 3.0)


def test_element_wise_chains_become_tables_equal_to_the_fake_quantized_model_int():
    """Each int8 -> int8 chain is one quantized_activation whose table is what the fake-quantized model computes:
    the program equals it bit for bit on each of the 256 input integers (fed as their real values: a real value
    half-way between two steps quantizes by x/scale in one and x*(1/scale) in the other)."""
    from tosakit.runtime import evaluate_exact

    x = torch.linspace(-6, 6, 4 * 64).reshape(1, 4, 8, 8)
    compiled = compile(Activations(), (x,), "cortex-m55", quantize=True)
    targets = [str(n.target) for n in compiled.edge.program.graph_module.graph.nodes if n.op == "call_function"]
    assert targets.count("cortex_m.quantized_activation.default") >= 3
    assert not [t for t in targets if t.startswith("aten.")], targets
    first = next(n for n in compiled.edge.program.graph_module.graph.nodes
                 if str(n.target) == "cortex_m.quantize_per_tensor.default")
    scale, zero_point = first.args[1], first.args[2]
    grid = ((torch.arange(-128, 128) - zero_point) * scale).reshape(1, 4, 8, 8)  # every input integer, no ties
    got = LoadedProgram(compiled.program.buffer, "activations.pte").run([grid])[0]
    assert torch.equal(got, evaluate_exact(compiled.quantized, grid)[0])


def test_minimum_and_maximum_share_one_quantization_int(tmp_path):
    """CortexMQuantizer gives a minimum's or maximum's operands and result one quantization, as ExecuTorch's does:
    each is a cortex_m:: kernel on the integers, and the program equals the fake-quantized model."""
    from tosakit.runtime import evaluate_exact

    torch.manual_seed(0)
    inputs = (torch.randn(1, 8, 4, 4), torch.randn(1, 8, 4, 4) * 3)
    compiled = compile(Extrema().eval(), inputs, "cortex-m55", quantize=True)
    assert {"cortex_m::minimum.out", "cortex_m::maximum.out"} <= set(compiled.program.emitted.kernel_ops)
    assert not {k for k in compiled.program.emitted.kernel_ops if k.startswith("aten::")}
    (tmp_path / "e.pte").write_bytes(compiled.program.buffer)
    got = load(tmp_path / "e.pte").run(list(inputs))[0]
    want = evaluate_exact(compiled.quantized, *inputs)[0]
    last = next(n for n in compiled.edge.program.graph_module.graph.nodes if n.op == "output").args[0][0]
    assert str(last.target) == "cortex_m.dequantize_per_tensor.default"
    step = last.args[1]  # the output's scale
    assert float((got - want).abs().max()) <= step * 1.01


def test_mv3_leaves_no_compute_to_portable_kernels(tmp_path):
    """MobileNetV3 for cortex-m55: hardswish and hardsigmoid are tables, the squeeze-excite gates channel-broadcast
    cortex_m muls; nothing but data moves stays a portable kernel, and the program tracks the fake-quantized
    model."""
    from tosakit.runtime import evaluate_exact
    from tosakit.zoo import MODELS

    model, inputs = MODELS["mv3"].factory()
    compiled = compile(model.eval(), inputs, "cortex-m55", quantize=True)
    (tmp_path / "mv3.pte").write_bytes(compiled.program.buffer)
    program = load(tmp_path / "mv3.pte")
    operators = {o.name + (f".{o.overload}" if o.overload else "") for o in program.plan().operators}
    assert {"cortex_m::quantized_activation.out", "cortex_m::quantized_mul.out"} <= operators
    assert not {o for o in operators if not o.startswith("cortex_m::")} - DATA_MOVES, operators
    got, want = program.run(list(inputs))[0], evaluate_exact(compiled.quantized, *inputs)[0]
    assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), 0) > 0.95


LAYER_NETS = ["deep_autoencoder", "ds_cnn", "mobilenet_v1_025", "mv2", "mv3", "resnet8"]  # ExecuTorch validates these


@pytest.mark.parametrize("name", LAYER_NETS)
def test_every_kernel_is_within_one_step_of_the_fake_quantized_layer_int(name):
    """Layer by layer: each cortex_m:: kernel, fed the fake-quantized model's own integers, gives that model's
    quantized output within one step (CMSIS-NN requantizes with a 31-bit multiplier and rounds twice; the model
    rounds the exact product once); most outputs are equal."""
    import copy

    from torch.fx import Interpreter

    from tosakit.backends.cortex_m.passes import REPLACES, pipeline
    from tosakit.flow import channels_last, quantize_model
    from tosakit.program import to_edge_transform_and_lower
    from tosakit.runtime.delegates import ExactInterpreter
    from tosakit.specs import CortexMCompileSpec
    from tosakit.zoo import MODELS

    model, inputs = MODELS[name].factory()
    model, inputs = channels_last(model.eval(), inputs)
    before = to_edge_transform_and_lower(export(quantize_model(model, inputs, CortexMCompileSpec()), inputs)) \
        .program.graph_module
    after = copy.deepcopy(before)
    for p in pipeline("MVE"):
        after = p(after)
    torch.manual_seed(1)
    fresh = tuple(torch.randn(x.shape).contiguous(memory_format=torch.channels_last) if x.dim() == 4
                  else torch.randn(x.shape) for x in inputs)
    reference: dict = {}
    ExactInterpreter(before, record=reference).run(*fresh)
    kernels = [n for n in after.graph.nodes if REPLACES in n.meta and str(n.target).startswith("cortex_m.")]
    assert kernels
    constants = Interpreter(after)

    def value(a):
        if a.op == "get_attr":
            return constants.fetch_attr(a.target)
        if a.target is scratch_buffer:
            return torch.zeros(a.args[0], dtype=torch.uint8)
        return reference[a.meta.get(REPLACES, a.name)]  # the fake-quantized model's integers

    steps, total = 0, 0
    for node in kernels:
        args = torch.fx.node.map_arg(node.args, value)
        got, want = node.target(*args).to(torch.int32), reference[node.meta[REPLACES]].to(torch.int32)
        diff = (got - want).abs()
        assert int(diff.max()) <= 1, (node.name, int(diff.max()))
        steps, total = steps + int((diff > 0).sum()), total + diff.numel()
    assert steps <= 0.02 * total, (steps, total)


def test_executorch_mv3_program_runs_equal_to_its_reference_kernels_int(et_oracle, tmp_path):
    """ExecuTorch's own cortex-m55 program of mv3 (its hardswish as cortex_m::minimum and mul, its tables, pools,
    convolutions) runs on tosakit's runtime and gives what ExecuTorch's reference kernels give for its lowered
    graph, bit for bit."""
    from tosakit.flow import channels_last
    from tosakit.zoo import MODELS

    model, inputs = MODELS["mv3"].factory()
    model, inputs = channels_last(model.eval(), inputs)
    result = et_oracle.cortex_m_export(model, inputs, tmp_path, target="cortex-m55", name="mv3")
    program = load(result["pte"])
    assert "cortex_m::minimum" in {o.name for o in program.plan().operators}
    got, want = program.run(list(inputs)), torch.load(result["reference"])
    assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want))


def test_importing_tosakit_leaves_the_cortex_m_namespace_to_executorch():
    """tosakit registers its cortex_m operators only when a Cortex-M flow or kernel needs them: a script that imports
    tosakit and then ExecuTorch (whose library defines the same namespace) is not refused by torch."""
    import subprocess
    import sys

    code = ("import torch, tosakit, tosakit.flow, tosakit.program, tosakit.runtime, tosakit.cli; "
            "print(hasattr(torch.ops.cortex_m, 'quantized_add'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]


def test_a_cpu_op_of_any_target_names_the_kernel_computing_it():
    """Placements of ops whose target is a Python builtin (getitem) or an ATen op name a portable kernel."""
    from tosakit.partition.partitioner import NodePlacement, note_cpu_kernels

    gm = torch.fx.symbolic_trace(lambda x: torch.relu(torch.split(x, 2)[0]))
    placements = [NodePlacement(n.name, str(n.target), "cpu") for n in gm.graph.nodes if n.op == "call_function"]
    assert len(placements) == 3 and any("getitem" in p.target for p in placements)
    note_cpu_kernels(gm, placements)
    assert [p.kernel for p in placements] == [f"portable {p.node}" for p in placements]
