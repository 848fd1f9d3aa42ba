"""Ethos-U85 weight and scale streams read back from Vela 5.2's payloads into the TOSA's own constants, bit for
bit, in every format Vela emits for U85 (standard SWD, fast-decode FWD with 8-bit values or 2/4-bit table
indices, 2:4 sparse in either), for one core and several; each test proves from the command stream that Vela
chose the format it is about, and runs the payload on the simulator: the reference model's outputs, bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from support.npu import assert_npu_bit_exact
from tosakit.backends.ethosu.payload import parse_payload
from tosakit.flow import compile
from tosakit.program import LoweredBackendModule
from tosakit.runtime.ethosu.commands import decode
from tosakit.runtime.ethosu.featuremap import Registers
from tosakit.runtime.ethosu.registers import register_map
from tosakit.runtime.ethosu.weights import U85Layout, decode_scales, decode_weights_u85, weight_streams_u85
from tosakit.specs import EthosUCompileSpec
from tosakit.zoo import MODELS

pytestmark = pytest.mark.numerics


def _tosa_convs(tosa: bytes) -> list[tuple[np.ndarray, np.ndarray]]:
    """(weights as [OFM, KH, KW, IFM], bias) of every CONV2D and DEPTHWISE_CONV2D of a TOSA flatbuffer, in order
    (depthwise weights as [C, KH, KW, 1])."""
    from tosa.DType import DType
    from tosa.Op import Op
    from tosa.TosaGraph import TosaGraph

    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    tensors = {block.Tensors(i).Name().decode(): block.Tensors(i) for i in range(block.TensorsLength())}
    types = {DType.INT8: "<i1", DType.INT16: "<i2", DType.INT32: "<i4"}

    def const(name: str) -> np.ndarray:
        t = tensors[name]
        raw = t.DataAsNumpy().tobytes()
        if t.Type() == DType.INT48:
            six = np.frombuffer(raw, np.uint8).reshape(-1, 6).astype(np.int64)
            flat = sum(six[:, k] << (8 * k) for k in range(6))
            flat = np.where(flat >= 1 << 47, flat - (1 << 48), flat)
        else:
            flat = np.frombuffer(raw, types[t.Type()]).astype(np.int64)
        return flat.reshape([int(d) for d in t.ShapeAsNumpy()])

    found = []
    for i in range(block.OperatorsLength()):
        op = block.Operators(i)
        if op.Op() in (Op.CONV2D, Op.DEPTHWISE_CONV2D):
            weights, bias = const(op.Inputs(1).decode()), const(op.Inputs(2).decode())
            if op.Op() == Op.DEPTHWISE_CONV2D:  # [KH, KW, C, M] -> [C*M, KH, KW, 1]
                kh, kw, c, m = weights.shape
                weights = weights.reshape(kh, kw, c * m).transpose(2, 0, 1)[..., None]
            found.append((weights, bias))
    return found


def _decoded_ops(payload, accelerator: str):
    """For each convolution of the payload's command stream: (format name, [OFM, KH, KW, IFM] weights, scale
    record), read from the payload alone, the DMAs that copy weights into SRAM applied in command order."""
    stream = decode(payload.cmd_data, accelerator)
    macs = stream.accelerator_config.macs_per_cycle
    regs = Registers(register_map(accelerator))
    memory = {0: bytearray(payload.weight_data), 1: bytearray(payload.scratch_size), 2: bytearray(2 << 20)}
    read = lambda region, base, length: bytes(memory[region][base: base + length])  # noqa: E731
    value = lambda register, field: regs.value(f"NPU_SET_{register}", field)  # noqa: E731
    found = []
    for command in stream.commands:
        name = command.register.name
        if name == "NPU_OP_DMA_START" and not value("DMA0_DST_REGION", "region_mode"):
            src, dst, length = value("DMA0_SRC", "addr"), value("DMA0_DST", "addr"), value("DMA0_LEN", "addr")
            memory[value("DMA0_DST_REGION", "region")][dst: dst + length] = read(value("DMA0_SRC_REGION", "region"),
                                                                                src, length)
        elif name in ("NPU_OP_CONV", "NPU_OP_DEPTHWISE") and not (name == "NPU_OP_CONV" and command.field("weights_ifm2")):
            layout = U85Layout.of(regs, name == "NPU_OP_DEPTHWISE", macs)
            streams, fwd = weight_streams_u85(regs, read, layout.cores)
            weights = decode_weights_u85(streams, layout, fwd)
            record = "u85_acc48" if value("ACC_FORMAT", "acc_format") else "u85_acc32"
            scales = decode_scales(read(value("SCALE_REGION", "region"), value("SCALE_BASE", "addr"),
                                        value("SCALE_LENGTH", "length")), layout.ofm_depth, record)
            kind = ("FWD-" + _fwd_kind(streams[0]) if fwd else "SWD") + ("+2:4" if layout.sparse else "")
            found.append((kind, weights, scales, len([s for s in streams if s])))
        elif not name.startswith("NPU_OP"):
            regs.set(command)
    return found


def _fwd_kind(stream: bytes) -> str:
    return "raw" if stream[0] & 1 else ("lut2" if stream[0] & 2 else "lut4")


def _delegates(model, inputs, accelerator, flags=(), **options):
    torch.manual_seed(0)
    spec = EthosUCompileSpec(accelerator, extra_flags=list(flags))
    compiled = compile(model.eval(), inputs, spec, quantize=True, calibration=[inputs], **options)
    return [(m.tosa, parse_payload(m.processed_bytes)) for m in compiled.edge.program.graph_module.children()
            if isinstance(m, LoweredBackendModule)]


def _check(model, inputs, accelerator, flags=(), **options) -> list[str]:
    """Every convolution's decoded weights and bias equal a TOSA convolution's (an OFM slice of it where Vela
    split the operation in depth); the formats seen, in stream order."""
    kinds = []
    for tosa, payload in _delegates(model, inputs, accelerator, flags, **options):
        convs = _tosa_convs(tosa)
        for kind, weights, scales, _ in _decoded_ops(payload, accelerator):
            depth = weights.shape[0]
            match = [(w, b, z) for w, b in convs if w.shape[1:] == weights.shape[1:]
                     for z in range(w.shape[0] - depth + 1) if np.array_equal(w[z: z + depth], weights)]
            assert match, f"{kind} weights {weights.shape} equal no TOSA convolution's"
            assert any(np.array_equal(b[z: z + depth], scales.bias) for _, b, z in match), f"{kind}: bias differs"
            kinds.append(kind)
        assert_npu_bit_exact(tosa, payload, seeds=(0,))
    assert kinds, "no convolution was delegated"
    return kinds


class Conv(nn.Module):
    """One 3x3 convolution and a fully connected layer, with weights made to a pattern."""

    def __init__(self, channels=32, pattern=None):
        super().__init__()
        self.conv = nn.Conv2d(channels, 48, 3, padding=1)
        self.fc = nn.Linear(48 * 4 * 4, 24)
        if pattern is not None:
            with torch.no_grad():
                for w in (self.conv.weight, self.fc.weight):
                    w.copy_(pattern(w))

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def _levels(n):
    """Weights on n levels per output channel (Vela's table formats need at most 4 or 16 distinct values)."""
    def pattern(w):
        q = torch.randint(-(n // 2), n // 2 + 1, w.shape, generator=torch.Generator().manual_seed(1)).float()
        return q * 0.05
    return pattern


def _two_of_four(w):
    """2:4 sparse along input channels: of each 4 consecutive, the 2 of largest magnitude kept."""
    flat = w.reshape(w.shape[0], -1, 4) if w.dim() == 2 else w.permute(0, 2, 3, 1).reshape(w.shape[0], -1, 4)
    keep = flat.abs().argsort(dim=-1)[..., 2:]
    pruned = torch.zeros_like(flat).scatter(-1, keep, flat.gather(-1, keep))
    if w.dim() == 2:
        return pruned.reshape(w.shape)
    return pruned.reshape(w.shape[0], w.shape[2], w.shape[3], w.shape[1]).permute(0, 3, 1, 2)


INPUT = (torch.randn(1, 32, 4, 4, generator=torch.Generator().manual_seed(0)),)


@pytest.mark.parametrize("accelerator,pattern,flags,want", [
    ("ethos-u85-256", None, (), "FWD-raw"),
    ("ethos-u85-256", _levels(3), (), "FWD-lut2"),
    ("ethos-u85-256", _levels(13), (), "FWD-lut4"),
    ("ethos-u85-256", None, ("--disable-fwd",), "SWD"),
    ("ethos-u85-256", _two_of_four, (), "+2:4"),
    ("ethos-u85-512", None, (), "FWD-raw"),
    ("ethos-u85-2048", None, ("--disable-fwd",), "SWD"),
    ("ethos-u85-128", None, (), "FWD-raw"),
])
def test_each_u85_weight_format_decodes_to_the_tosa_weights(accelerator, pattern, flags, want):
    kinds = _check(Conv(pattern=pattern), INPUT, accelerator, flags)
    assert any(want in k for k in kinds), f"Vela chose {kinds}, not {want}"


def test_u85_standard_weights_stream_per_core():
    """SWD on a 4-core ethos-u85-2048: one stream per core, OFM channels dealt out in groups of 4."""
    [(_, payload)] = _delegates(Conv(), INPUT, "ethos-u85-2048", ("--disable-fwd",))
    ops = _decoded_ops(payload, "ethos-u85-2048")
    assert ops and all(kind == "SWD" and streams == 4 for kind, _, _, streams in ops)


@pytest.mark.parametrize("model_name", ["digits", "waves", pytest.param("mv2", marks=pytest.mark.slow)])
@pytest.mark.parametrize("accelerator", ["ethos-u85-256", pytest.param("ethos-u85-2048", marks=pytest.mark.slow)])
def test_builtin_model_weights_decode(model_name, accelerator):
    model, inputs = MODELS[model_name].factory()
    _check(model, inputs, accelerator)


def test_a16w8_weights_and_48_bit_bias_records_decode():
    from tosakit.quantize import get_symmetric_a16w8_quantization_config

    model, inputs = MODELS["digits"].factory()
    _check(model, inputs, "ethos-u85-256", config=get_symmetric_a16w8_quantization_config())
