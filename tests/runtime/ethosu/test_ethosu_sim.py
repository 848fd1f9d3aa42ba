"""The Ethos-U55/U65 command-stream simulator against the TOSA reference model, bit for bit: the same TOSA
compiled by Vela and run by the simulator from the payload's bytes (command stream, weights, I/O table)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from support.npu import NPU_DIFFERENCES, assert_npu_bit_exact, assert_u85_bit_exact, ethosu_delegates, npu_inputs
from support.op_tables import INT8_TABLES
from support.op_tables.shape import TABLE as SHAPE
from support.shared import case_key
from tosakit.capture import export
from tosakit.errors import TosakitError
from tosakit.flow import compile, quantize_model
from tosakit.runtime.ethosu import weights
from tosakit.runtime.ethosu.codec import CODEC
from tosakit.runtime.ethosu.commands import decode
from tosakit.runtime.ethosu.executors import convolution
from tosakit.runtime.ethosu.memory import NpuAccessError
from tosakit.runtime.ethosu.npu import weight_streams
from tosakit.runtime.ethosu.registers import register_map
from tosakit.runtime.ethosu.simulate import memory_needed, simulate
from tosakit.runtime.ethosu.weights import brick_order
from tosakit.specs import EthosUCompileSpec
from tosakit.zoo import MODELS

pytestmark = pytest.mark.numerics

# The configurations the acceptance asks for: (target, memory mode); None = the target's default.
CONFIGS = [("ethos-u55-128", "Shared_Sram"), ("ethos-u55-128", "Sram_Only"), ("ethos-u55-64", None),
           ("ethos-u55-256", None), ("ethos-u65-256", "Dedicated_Sram")]


_TOSAS: dict[tuple[str, str], list[bytes]] = {}  # its delegates' TOSA, lowered once per profile


def quantized_once(model: nn.Module, inputs: tuple, spec: EthosUCompileSpec, **calibration):
    """``model`` quantized for ``spec``'s TOSA profile (the quantizer reads the profile, not the configuration),
    exported: each configuration's compile lowers it as it is, without quantizing or exporting it again."""
    return export(quantize_model(model, inputs, spec, **calibration), inputs)


def delegates(model: nn.Module, inputs: tuple, target="ethos-u55-128", memory_mode=None, key: str | None = None,
              **options):
    """(TOSA, parsed payload) of each Ethos-U delegate of ``model`` compiled int8 for ``target``; with ``key`` (a
    model's name), quantized and lowered once per TOSA profile in this test process, each further configuration
    compiling that TOSA with Vela."""
    torch.manual_seed(0)
    spec = EthosUCompileSpec(target, memory_mode=memory_mode)
    if key is None or options:
        found = ethosu_delegates(compile(model.eval(), inputs, spec, quantize=True, calibration=[inputs], **options))
    elif (profile := (key, str(spec.tosa_spec))) in _TOSAS:
        found = list(compiled_for([(target, memory_mode)], _TOSAS[profile]))
    else:
        quantized = quantized_once(model.eval(), inputs, spec, calibration=[inputs])
        found = ethosu_delegates(compile(quantized, inputs, spec))  # already quantized: lowered and compiled only
        _TOSAS[profile] = [tosa for tosa, _ in found]
    assert found, "nothing was delegated"
    return found


def compiled_for(configs: list[tuple[str, str | None]], tosas: list[bytes]):
    """(TOSA, parsed payload): each TOSA compiled by Vela alone for each (target, memory mode)."""
    from tosakit.backends.ethosu.payload import pack_payload, parse_payload
    from tosakit.backends.ethosu.vela import compile_tosa

    for target, memory_mode in configs:
        spec = EthosUCompileSpec(target, memory_mode=memory_mode)
        yield from ((tosa, parse_payload(pack_payload(compile_tosa(tosa, spec)))) for tosa in tosas)


def assert_bit_exact(model, inputs, target="ethos-u55-128", memory_mode=None, **options):
    for tosa, payload in delegates(model, inputs, target, memory_mode, **options):
        assert_npu_bit_exact(tosa, payload, seeds=(0, 1, 2))


class Conv(nn.Module):
    def __init__(self, cin=3, cout=8, k=3, stride=1, padding=1, dilation=1, groups=1, relu=True):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, stride, padding, dilation, groups)
        self.relu = relu

    def forward(self, x):
        y = self.conv(x)
        return torch.relu(y) if self.relu else y


CONVS = {
    "3x3": (Conv(), (1, 3, 8, 8)),
    "1x1": (Conv(16, 24, 1, padding=0, relu=False), (1, 16, 6, 6)),
    "5x5_stride2": (Conv(4, 20, 5, stride=2, padding=2), (1, 4, 11, 11)),
    "3x3_dilation2": (Conv(8, 8, 3, padding=2, dilation=2), (1, 8, 9, 9)),
    "depthwise": (Conv(16, 16, 3, groups=16), (1, 16, 7, 7)),
    "deep": (Conv(40, 70, 3), (1, 40, 5, 5)),
}


@pytest.mark.parametrize("case", CONVS)
def test_conv_u55(case):
    model, shape = CONVS[case]
    assert_bit_exact(model, (torch.randn(shape),))


class Linear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(48, 10)

    def forward(self, x):
        return self.fc(x)


def test_linear_u55():
    assert_bit_exact(Linear(), (torch.randn(1, 48),))


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_pool_u55(pool):
    layer = nn.MaxPool2d(2) if pool == "max" else nn.AvgPool2d(3, stride=1, padding=1)
    assert_bit_exact(layer, (torch.randn(1, 16, 8, 8),))


def test_digits_u55():
    from tosakit.zoo import MODELS

    model, inputs = MODELS["digits"].factory()
    assert_bit_exact(model, inputs)


def test_scratch_read_before_write_names_the_command():
    """A payload whose input offset is moved: the first read of the real offset is of bytes nothing wrote."""
    (tosa, payload), = delegates(CONVS["3x3"][0], (torch.randn(1, 3, 8, 8),), "ethos-u55-128")
    t = payload.inputs[0]
    payload.inputs[0] = type(t)(t.shape, t.elem_size, t.offset + 64 * 1024, t.region)
    payload.scratch_size += 128 * 1024
    with pytest.raises(NpuAccessError, match=r"command at offset 0x[0-9a-f]+ \(NPU_OP_\w+\) reads byte"):
        simulate(payload, npu_inputs(payload, 0), "ethos-u55-128")


def test_scratch_too_small_names_the_command():
    (tosa, payload), = delegates(CONVS["3x3"][0], (torch.randn(1, 3, 8, 8),), "ethos-u55-128")
    payload.scratch_size = max(t.offset + int(np.prod(t.shape)) * t.elem_size for t in payload.inputs)
    with pytest.raises(TosakitError, match=r"command at offset 0x[0-9a-f]+ \(NPU_OP_\w+\) (writes|reads) bytes"):
        simulate(payload, npu_inputs(payload, 0), "ethos-u55-128")


# ------------------------------------------------------------------ weights


@pytest.mark.parametrize("depthwise,part_kernel", [(False, False), (False, True), (True, False)])
@pytest.mark.parametrize("bits", [8, 16])
def test_brick_order_is_vela_codecs(depthwise, part_kernel, bits):
    """The order decode_weights inverts is the one Vela's own codec reorders weights into, over kernel sizes
    (sub-kernel splits above 8), dilation (4x4 sub-kernels), OFM/IFM depths off the block sizes."""
    from ethosu import mlw_codec

    rng = np.random.default_rng(0)
    for oc, kh, kw, ic, block, dilation in [(3, 1, 1, 1, 8, 1), (20, 3, 3, 40, 16, 1), (8, 9, 5, 5, 8, 1),
                                            (17, 3, 3, 33, 16, 2), (16, 1, 1, 70, 8, 1)]:
        ic = 1 if depthwise else ic
        w = rng.integers(-255, 256, (oc, kh, kw, ic)).astype(np.int16)
        sub = 8 // dilation
        encoded, _ = mlw_codec.reorder_encode(8, 8, w, block, depthwise, part_kernel, bits, sub, sub)
        order = brick_order(oc, kh, kw, ic, ofm_block_depth=min(block, oc), depthwise=depthwise,
                            part_kernel_first=part_kernel, ifm_bits=bits, decomposition=(sub, sub), ofm_ublock=8)
        stream = np.asarray(mlw_codec.decode(encoded))[: order.size]
        assert np.array_equal(stream, np.where(order >= 0, w.reshape(-1)[np.maximum(order, 0)], 0))


@pytest.mark.parametrize("target,memory_mode", [("ethos-u55-128", "Shared_Sram"), ("ethos-u65-256", "Dedicated_Sram"),
                                                ("ethos-u55-128", "Sram_Only")])
def test_weight_streams_found_ahead_are_the_ones_the_run_reads(target, memory_mode, monkeypatch):
    """The streams the codec decodes ahead of a run, found from the registers alone, are exactly the ones
    its convolutions read, in order: from flash, or through the DMA that copied them into SRAM."""
    model, inputs = MODELS["mv2"].factory()
    [(_, payload)] = delegates(model, inputs, target, memory_mode, key="mv2")
    stream = decode(payload.cmd_data)
    regions = {c.field("region") for c in stream.commands if c.register.name == "NPU_SET_WEIGHT_REGION"}
    # Weights read from flash (region 0), and from the SRAM a DMA copied them into: the scratch (region 1) in
    # Shared_Sram, the fast scratch (region 2) in Dedicated_Sram.
    assert regions == {"Sram_Only": {0}, "Shared_Sram": {0, 1}, "Dedicated_Sram": {0, 2}}[memory_mode]
    ahead = weight_streams(stream.commands, register_map(stream.accelerator_config.accelerator), payload.weight_data,
                           budget=1 << 30)
    read, original = [], convolution.decode_weights
    monkeypatch.setattr(convolution, "decode_weights", lambda data, **kw: read.append(data) or original(data, **kw))
    weights.clear_caches()
    simulate(payload, npu_inputs(payload, seed=0))
    assert ahead and ahead == list(dict.fromkeys(read))


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_a_program_run_again_decodes_no_weights_when_they_fit_the_cache_once(target, monkeypatch):
    """The decoded-weight cache holds a byte per int8 weight, keyed by a digest of its stream: with a budget
    of 1.1 bytes per weight, a second run decodes nothing (a 1-layer SmolLM2's 28M-weight lm_head was decoded
    on every call when the cache kept int16 values and the stream bytes)."""
    model, inputs = MODELS["mv2"].factory()
    [(_, payload)] = delegates(model, inputs, target, key="mv2")
    weight_count = sum(m.weight.numel() for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))
    monkeypatch.setattr(weights._Decoded, "BUDGET", int(1.1 * weight_count))
    misses = []
    for name in ("_decode", "_decode_u85"):
        monkeypatch.setattr(weights, name, lambda *args, original=getattr(weights, name): misses.append(1) or
                            original(*args))
    weights.clear_caches()
    first = simulate(payload, npu_inputs(payload, seed=0)).outputs
    assert len(misses) > 40  # mv2's 52 convolutions and its classifier, some split by Vela
    misses.clear()
    second = simulate(payload, npu_inputs(payload, seed=0)).outputs
    assert misses == [] and weights._DECODED.nbytes <= 1.01 * weight_count  # a byte per weight
    assert all(np.array_equal(a, b) for a, b in zip(first, second))


def test_fast_scratch_is_what_vela_planned():
    """The fast scratch a payload does not size: the simulator lends what the stream addresses (Wav2Letter's
    Dedicated_Sram stream on a 400-sample input, 13.3 MiB, ran out of a fixed 2 MiB), reports it, and it lies within
    Vela's plan; past the memory limit (2 MiB counted up front, more as the limit allows) the command is named."""
    from tosakit.backends.ethosu.vela import compile_tosa

    model, inputs = MODELS["wav2letter"].factory()
    spec = EthosUCompileSpec("ethos-u65-256", memory_mode="Dedicated_Sram")
    compiled = compile(model, inputs, spec, quantize=True)
    [(tosa, payload)] = ethosu_delegates(compiled)
    planned = compile_tosa(tosa, spec).fast_scratch_size
    run = simulate(payload, npu_inputs(payload, seed=0))
    assert 1 << 20 < run.fast_scratch_bytes <= planned
    assert_npu_bit_exact(tosa, payload, seeds=(0,))
    from tosakit.runtime.ethosu.memory import Memory, Region

    memory = Memory([Region.growing(2, 4096)])
    memory.where = "command at offset 0x40 (NPU_OP_DMA_START)"
    memory.check_span(2, 0, 4096, "writes")
    with pytest.raises(NpuAccessError, match=r"0x40 \(NPU_OP_DMA_START\) writes bytes \[0x800, 0x1001\) of region 2 "
                                             r"\(fast scratch\), more than the 4096-byte memory limit"):
        memory.check_span(2, 2048, 4097, "writes")
    assert memory_needed(payload) == 2 * (payload.scratch_size + len(payload.weight_data) + (2 << 20))


def test_codec_decodes_ahead_and_keeps_each_error_for_its_stream():
    """Streams decoded ahead answer as when asked one by one; a stream that ends the codec's process fails
    only the operation that reads it, and a damaged stream nobody reads fails nothing."""
    from ethosu import mlw_codec

    rng = np.random.default_rng(0)
    w = rng.integers(-255, 256, (8, 1, 1, 16)).astype(np.int16)
    good = bytes(mlw_codec.reorder_encode(8, 8, w, 8, False, False, 8, 8, 8)[0])
    alone = CODEC.decode(good)
    cut, unread = good[:5], good[:16]  # each makes the codec exit(1)
    with CODEC.ahead([cut, good, unread]):
        with pytest.raises(TosakitError, match="weight codec stopped on the weight stream .5 bytes"):
            CODEC.decode(cut)
        assert np.array_equal(CODEC.decode(good), alone)
        assert np.array_equal(CODEC.decode(good[:]), alone)
    assert np.array_equal(CODEC.decode(good), alone)


# ------------------------------------------------------------------ elementwise, LUTs, reductions


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *x):
        return self.fn(*x)


ELEMENTWISE = {  # name: (function, number of inputs)
    "add": (lambda a, b: a + b, 2),
    "sub": (lambda a, b: a - b, 2),
    "mul": (lambda a, b: a * b, 2),
    "add_broadcast_w": (lambda a, b: a + b[:, :, :1, :], 2),
    "add_broadcast_first": (lambda a, b: a[:, :1, :, :] + b, 2),  # reversed operands (IFM2 is operand A)
    "sub_broadcast_first": (lambda a, b: a[:, :, :, :1] - b, 2),
    "maximum": (torch.maximum, 2),
    "minimum": (torch.minimum, 2),
    "add_scalar": (lambda a: a + 0.5, 1),
    "mul_scalar": (lambda a: a * 3.0, 1),
    "abs": (torch.abs, 1),
    "leaky_relu": (lambda a: nn.functional.leaky_relu(a, 0.1), 1),
    "relu": (torch.relu, 1),
    "sigmoid": (torch.sigmoid, 1),
    "tanh": (torch.tanh, 1),
    "hardswish": (nn.functional.hardswish, 1),
    "mean_hw": (lambda a: a.mean(dim=(2, 3), keepdim=True), 1),
    "sum_c": (lambda a: a.sum(dim=1, keepdim=True), 1),
    "softmax": (lambda a: a.softmax(dim=-1), 1),
}


@pytest.mark.parametrize("name", ELEMENTWISE)
def test_elementwise_u55(name):
    fn, n = ELEMENTWISE[name]
    torch.manual_seed(1)
    assert_bit_exact(Fn(fn), tuple(torch.randn(1, 8, 5, 7) for _ in range(n)))


class EqualScaleResidual(nn.Module):
    """y + f(y) where f is a 3x3 identity convolution: both ADD operands calibrate to one quantization, as most
    of MobileNetV2's residual ADDs do."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(8, 16, 1)
        self.b = nn.Conv2d(16, 16, 3, padding=1)
        nn.init.dirac_(self.b.weight)
        nn.init.zeros_(self.b.bias)

    def forward(self, x):
        y = self.a(x)
        return y + self.b(y)


def _add_input_rescales(tosa: bytes) -> list[list[tuple[int, int]]]:
    """Per TOSA ADD: the (multiplier, shift) of the RESCALE writing each of its operands."""
    from tosa.TosaGraph import TosaGraph

    from tosakit.lower.tosa_graph import Op

    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    tensors = {block.Tensors(i).Name().decode(): block.Tensors(i) for i in range(block.TensorsLength())}
    ops = [block.Operators(i) for i in range(block.OperatorsLength())]
    writer = {op.Outputs(j).decode(): op for op in ops for j in range(op.OutputsLength())}

    def const(name, dtype):
        return int(tensors[name.decode()].DataAsNumpy().view(dtype)[0])

    return [[(const(r.Inputs(1), np.int32), const(r.Inputs(2), np.int8))
             for r in (writer[op.Inputs(j).decode()] for j in range(op.InputsLength()))]
            for op in ops if op.Op() == Op.ADD]


def test_equal_scale_residual_add_is_one_npu_add_u55():
    """Operands on one scale meet in int32 shifted by 14 bits (multiplier 2**30, shift 16), which Vela folds
    into the NPU Add (a 16-bit scale with no shift): one Add, no RESCALE of its own, where 2**19 cost each
    operand an Add and a Mul. The program stays bit-exact."""
    torch.manual_seed(0)
    inputs = (torch.randn(1, 8, 28, 28),)
    spec = EthosUCompileSpec("ethos-u55-128", memory_mode="Shared_Sram")
    compiled = compile(EqualScaleResidual().eval(), inputs, spec, quantize=True, calibration=[inputs])
    [(tosa, payload)] = ethosu_delegates(compiled)
    assert _add_input_rescales(tosa) == [[(1 << 30, 16), (1 << 30, 16)]]
    [delegate] = compiled.edge.delegates
    rows = [(o.tosa_op, o.npu_operator) for o in delegate.report.per_op]
    assert rows.count(("ADD", "Add")) == 1 and not [r for r in rows if r[0] == "RESCALE"], rows
    assert_npu_bit_exact(tosa, payload, seeds=(0, 1, 2))


class ChannelLogSoftmax(nn.Module):
    """A 1-D CNN's head (wav2letter's): log-softmax over the channels of a convolution's output."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(8, 24, 3, padding=1)

    def forward(self, x):
        return torch.log_softmax(self.conv(x), dim=1)


def _reduce_max_axes(tosa: bytes) -> list[tuple[tuple[int, ...], int]]:
    """Per TOSA REDUCE_MAX: its input's shape and the axis it reduces."""
    from tosa.ReduceMaxAttribute import ReduceMaxAttribute
    from tosa.TosaGraph import TosaGraph

    from tosakit.lower.tosa_graph import Op

    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    tensors = {block.Tensors(i).Name().decode(): block.Tensors(i) for i in range(block.TensorsLength())}
    out = []
    for op in (block.Operators(i) for i in range(block.OperatorsLength())):
        if op.Op() == Op.REDUCE_MAX:
            attr = ReduceMaxAttribute()
            attr.Init(op.Attribute().Bytes, op.Attribute().Pos)
            out.append((tuple(tensors[op.Inputs(0).decode()].ShapeAsNumpy()), attr.Axis()))
    return out


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_channel_max_reduces_in_torch_order_u55_u85(harness, target):
    """Vela reduces a max over the innermost (channel) axis about ten times slower than over an outer one, so
    the channels-last convolution output is moved to torch order for the REDUCE_MAX: [1, 24, 16] reduced over
    axis 1, not [1, 16, 24] over axis 2 (wav2letter's log-softmax: 13,157 -> 1,053 cycles on ethos-u85-256).
    Every op on the NPU, the integers match the fake-quantized model, on U55 the stream simulates bit for bit."""
    torch.manual_seed(0)
    compiled = harness.ethosu(ChannelLogSoftmax().eval(), (torch.randn(1, 8, 16),), target)
    [(tosa, _)] = ethosu_delegates(compiled)
    assert _reduce_max_axes(tosa) == [((1, 24, 16), 1)]


# ------------------------------------------------------------------ the built-in models, every configuration

_SMALL = ["add", "add3", "softmax", "digits", "waves", "audio1d", "lstm"]
# Models whose streams hold no command the others' do not (1-D convolutions, unrolled recurrences, attention), and
# slow to simulate: run on each family's first configuration, not on every one.
_FIRST_CONFIG_ONLY = {"wav2letter", "conformer", "crnn", "yolo"}
# The largest of the others, slow too: each on the first configuration and one other in turn, so that every
# configuration still runs one of them besides the small models and the MLPerf Tiny networks.
_TWO_CONFIGS = ["mv2", "mv3", "resnet18", "transformer", "unet"]


def _runs_on(model: str, k: int, n: int) -> bool:
    """Whether ``model`` is simulated on the ``k``-th of ``n`` configurations."""
    if k == 0 or model in _SMALL:
        return True
    if model in _TWO_CONFIGS:
        return k == 1 + _TWO_CONFIGS.index(model) % (n - 1)
    return model not in _FIRST_CONFIG_ONLY


def _model_configs(configs):
    """(model, target, memory mode) params: every built-in model on ``configs`` (see ``_runs_on``)."""
    return [pytest.param(m, t, mode, id=f"{m}-{t}-{mode or 'default'}",
                         marks=() if m in _SMALL else pytest.mark.slow)
            for m in MODELS for k, (t, mode) in enumerate(configs) if _runs_on(m, k, len(configs))]


@pytest.mark.parametrize("model_name,target,memory_mode", _model_configs(CONFIGS))
def test_builtin_model_u55(model_name, target, memory_mode):
    """Every built-in model, int8, simulated from its payload: the reference model's outputs bit for bit."""
    model, inputs = MODELS[model_name].factory()
    found = delegates(model, inputs, target, memory_mode, key=model_name)
    for tosa, payload in found:
        assert_npu_bit_exact(tosa, payload, seeds=(0,))


A16W8 = ["add", "add3", "softmax", "digits", "waves", "audio1d", "lstm", *(pytest.param(m, marks=pytest.mark.slow)
                                                          for m in ("mv2", "mv3", "resnet18", "unet"))]


@pytest.mark.parametrize("model_name", A16W8)
def test_builtin_model_a16w8_u55(model_name):
    """The built-in models that lower with 16-bit activations (a16w8), simulated bit for bit."""
    from tosakit.quantize import get_symmetric_a16w8_quantization_config

    model, inputs = MODELS[model_name].factory()
    for tosa, payload in delegates(model, inputs, config=get_symmetric_a16w8_quantization_config()):
        assert_npu_bit_exact(tosa, payload, seeds=(0,))


# ------------------------------------------------------------------ every _u55 op-table case, every configuration

_OTHER_CONFIGS = CONFIGS[1:]  # ethos-u55-128 Shared_Sram is the op tests' own target (Harness.ethosu)


def _op_cases(flavour: str = "u55"):
    """The op-table cases of ``flavour`` ("u55" or "u85")."""
    return [param for table in INT8_TABLES for param in table.params(flavour)]


def test_an_exported_program_compiles_for_each_configuration_as_its_graph_does():
    """The sweeps export a quantized graph once and compile that for every configuration: each program equals the
    one compiling the graph itself gives, whatever was compiled from the export before (nothing is changed in it)."""
    model, shape = CONVS["5x5_stride2"]
    inputs = (torch.randn(shape, generator=torch.Generator().manual_seed(0)),)
    torch.manual_seed(0)
    spec = EthosUCompileSpec("ethos-u55-64")
    graph = quantize_model(model.eval(), inputs, spec)
    exported = export(graph, inputs)
    for target, memory_mode in [*CONFIGS[1:], ("ethos-u85-256", None), CONFIGS[1]]:
        each = EthosUCompileSpec(target, memory_mode=memory_mode)
        assert compile(exported, inputs, each).program.buffer == compile(graph, inputs, each).program.buffer
    with pytest.raises(TosakitError, match="cannot be quantized"):
        compile(exported, inputs, spec, quantize=True)


@pytest.mark.slow
@pytest.mark.parametrize("op_table,name", _op_cases())
def test_op_case_every_configuration(op_table, name):
    """Each op-table case the U55 takes, compiled for the other four configurations, simulated bit for bit
    (or differing exactly where NPU_DIFFERENCES pins it): the flow once, then its TOSA by Vela for the others."""
    module, inputs = op_table.build(name)
    torch.manual_seed(0)
    quantized = quantized_once(module, inputs, EthosUCompileSpec("ethos-u55-64"))  # one profile for U55 and U65
    (target, memory_mode), *others = _OTHER_CONFIGS
    found = ethosu_delegates(compile(quantized, inputs, EthosUCompileSpec(target, memory_mode=memory_mode)))
    for tosa, payload in found + list(compiled_for(others, [tosa for tosa, _ in found])):
        if name in NPU_DIFFERENCES:
            with pytest.raises(AssertionError, match="values differ"):
                assert_npu_bit_exact(tosa, payload, seeds=(0,))
        else:
            assert_npu_bit_exact(tosa, payload, seeds=(0,))


# ------------------------------------------------------------------ Ethos-U85

U85_CONFIGS = [("ethos-u85-128", None), ("ethos-u85-256", None), ("ethos-u85-256", "Dedicated_Sram"),
               ("ethos-u85-512", None), ("ethos-u85-2048", None)]
# Op-table cases whose U85 stream holds a command (as its listing names it) no built-in model's does: each must keep
# holding it, so that what the simulator runs stays proven bit for bit.
U85_COVERS = {
    "matmul_2d": "NPU_OP_CONV                        1, weights_ifm2 = 1", "bmm": "weights_ifm2 = 1",
    "upsample_bilinear_2x": "RESIZE_MODE_BILINEAR", "upsample_nearest_3x": "RESIZE_MODE_NEAREST",
    "eq_scalar": "ELEMENTWISE_MODE_CMP_EQ", "ge_scalar": "ELEMENTWISE_MODE_CMP_GE", "gt_where": "ELEMENTWISE_MODE_CMP_GT",
    "bitwise_on_masks": "ELEMENTWISE_MODE_XOR", "logical_not": "ELEMENTWISE_MODE_NOT", "logical_or": "ELEMENTWISE_MODE_OR",
    "bool_to_float": "ELEMENTWISE_MODE_AND_NOT", "logical_and": "elementwise_mode = ELEMENTWISE_MODE_AND\n",
    "neg": "NPU_SET_IFM_BROADCAST              8, broadcast_mode = BROADCAST_MODE_SCALAR",
    "conv_transpose2d": "acc_input = ACC_INPUT_IFM2", "mean_all": "POOLING_MODE_NONE",
    "conv_amin_channels": "POOLING_MODE_MIN", "flip": "ACTIVATION_REVERSE_H", "pad_reflect": "ACTIVATION_REVERSE_W",
    "gather": "idx_mode = DMA_IDX_MODE_ENABLED", "index_select": "stride_mode = DMA_STRIDE_MODE_D3",
    "index_put_rows": "DMA_REGION_MODE_EXTERNAL, idx_mode = DMA_IDX_MODE_ENABLED",  # the scatter's DST end
}


@pytest.mark.parametrize("model_name,target,memory_mode", _model_configs(U85_CONFIGS))
def test_builtin_model_u85(model_name, target, memory_mode):
    """Every built-in model, int8, on every Ethos-U85 configuration: the reference model's outputs bit for bit
    (transformer's MatMuls read IFM2 as weights, unet resizes bilinear and nearest)."""
    model, inputs = MODELS[model_name].factory()
    assert_u85_bit_exact(delegates(model, inputs, target, memory_mode, key=model_name))


@pytest.mark.parametrize("model_name", A16W8)
def test_builtin_model_a16w8_u85(model_name):
    """16-bit activations on ethos-u85-256 (48-bit accumulators and bias records), bit for bit."""
    from tosakit.quantize import get_symmetric_a16w8_quantization_config

    model, inputs = MODELS[model_name].factory()
    assert_u85_bit_exact(delegates(model, inputs, "ethos-u85-256", config=get_symmetric_a16w8_quantization_config()))


@pytest.mark.parametrize("op_table,name", _op_cases("u85"))
def test_op_case_u85(op_table, name, streams):
    """Each op-table case the U85 takes, on ethos-u85-256, bit for bit; the cases of U85_COVERS with the command
    they stand for in their stream (and three input seeds). The streams are test_ops' _u85 compile of the case
    when that ran first in this test run."""
    found = streams.get(case_key(op_table, name, "ethos-u85-256"))
    if found is None:
        module, inputs = op_table.build(name)
        torch.manual_seed(0)
        found = ethosu_delegates(compile(module, inputs, EthosUCompileSpec("ethos-u85-256"), quantize=True))
    listing = assert_u85_bit_exact(found, seeds=(0, 1, 2) if name in U85_COVERS else (0,))
    assert U85_COVERS.get(name, "") in listing


@pytest.mark.slow
@pytest.mark.parametrize("op_table,name", _op_cases("u85"))
def test_op_case_every_u85_configuration(op_table, name, streams):
    """Each op-table case the U85 takes, compiled for the other four Ethos-U85 configurations, bit for bit: the
    TOSA of its ethos-u85-256 compile (test_ops' when that ran first in this run) by Vela for each."""
    found = streams.get(case_key(op_table, name, "ethos-u85-256"))
    if found is None:
        module, inputs = op_table.build(name)
        torch.manual_seed(0)
        found = ethosu_delegates(compile(module, inputs, EthosUCompileSpec("ethos-u85-256"), quantize=True))
    others = [c for c in U85_CONFIGS if c != ("ethos-u85-256", None)]
    assert_u85_bit_exact(list(compiled_for(others, [tosa for tosa, _ in found])))


def test_u85_gather_index_out_of_range_names_the_command():
    """index_select's rows come through the DMA's index array (constant data): an index past IDX_MAX, as a damaged
    payload could hold, is an error naming the DMA, not a read of another tensor's bytes."""
    module, inputs = SHAPE.build("index_select")
    torch.manual_seed(0)
    compiled = compile(module, inputs, EthosUCompileSpec("ethos-u85-256"), quantize=True)
    (tosa, payload), = ethosu_delegates(compiled)
    commands = decode(payload.cmd_data).commands
    at = next(c.field("addr") for c in commands if c.register.name == "NPU_SET_DMA0_IDX")
    assert next(c.field("region") for c in commands if c.register.name == "NPU_SET_DMA0_IDX_REGION") == 0
    assert_npu_bit_exact(tosa, payload, seeds=(0,))
    weights = bytearray(payload.weight_data)
    weights[at: at + 4] = (7).to_bytes(4, "little")
    payload.weight_data = bytes(weights)
    with pytest.raises(TosakitError, match=r"command at offset 0x[0-9a-f]+ \(NPU_OP_DMA_START\) gathers row 7, "
                                           r"outside 0\.\.2 \(IDX_MAX\)"):
        simulate(payload, npu_inputs(payload, 0))


def test_u85_scatter_position_out_of_range_names_the_command():
    """A KV cache written at a position the cache does not have: the simulator's scatter names the DMA, and the
    reference model's run is refused before it starts, naming the input."""
    from tosakit.runtime.tosa_inprocess import run_tosa
    from tosakit.runtime.tosa_validate import check_tosa

    module, inputs = SHAPE.build("index_put_rows")
    torch.manual_seed(0)
    compiled = compile(module, inputs, EthosUCompileSpec("ethos-u85-256"), quantize=True)
    (tosa, payload), = ethosu_delegates(compiled)
    xs = npu_inputs(payload, 0, tosa)
    k = next(k for k, t in enumerate(payload.inputs) if t.elem_size == 4)  # the int32 positions
    xs[k] = np.array([3, 99], np.int32).reshape(xs[k].shape)
    with pytest.raises(TosakitError, match=r"\(NPU_OP_DMA_START\) scatters row 99, outside 0\.\.15 \(IDX_MAX\)"):
        simulate(payload, xs)
    with pytest.raises(TosakitError, match=r"holds index 99, outside 0\.\.15"):
        run_tosa(tosa, [x.reshape(t.shape) for x, t in zip(xs, check_tosa(tosa, "delegate", 1 << 31).inputs)])
