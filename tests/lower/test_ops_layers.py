"""Layer ops beyond their table (support/op_tables/layers.py, run by test_ops.py): refusals with their reasons,
embeddings, grouped and dilated convolutions' forms, transposed convolutions' phases."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from support.npu import ethosu_delegates
from support.op_cases import seed_inputs
from support.op_tables.layers import TABLE, TOKENS, TokenEmbedding

pytestmark = pytest.mark.numerics


def test_adaptive_avg_pool_uneven_windows_refused_with_reason(harness):
    """7x7 to 3x3 needs windows of different sizes: the op stays on the CPU and the reason says so."""
    compiled = harness.compile(nn.AdaptiveAvgPool2d(3).eval(), seed_inputs((1, 4, 7, 7)), "TOSA-1.0+FP",
                               quantize=False)
    [left] = harness.cpu_compute(compiled)
    assert "adaptive" in left.target and "windows of different sizes" in left.reason


def test_upsample_refused_on_u55_with_reason(harness):
    """A bilinear upsampling past what the phase form keeps exact stays on the CPU with the limit named."""
    module = nn.Sequential(nn.Conv2d(4, 4, 1), nn.Upsample(scale_factor=64, mode="bilinear"))
    compiled = harness.compile(module.eval(), seed_inputs((1, 4, 2, 2)), "ethos-u55-128", quantize=True)
    [left] = harness.cpu_compute(compiled)
    assert "upsample" in left.target and "up to 63x per axis (this one is 64x64)" in left.reason
    assert compiled.edge.delegates  # the convolution still runs on the NPU


@pytest.mark.parametrize("flavour", ["fp", "int", "u85"])
def test_embedding(harness, flavour):
    """GATHER of the embedding table at int32 token ids."""
    torch.manual_seed(0)
    module = TokenEmbedding().eval()
    compiled = {"fp": harness.fp, "int": harness.int}.get(flavour, lambda m, i: harness.ethosu(m, i, "ethos-u85-256"))(
        module, TOKENS)
    assert any("GATHER" in d.tosa_ops for d in compiled.edge.delegates)


def test_embedding_refused_on_u55_with_reason(harness):
    torch.manual_seed(0)
    compiled = harness.compile(TokenEmbedding().eval(), TOKENS, "ethos-u55-128", quantize=True)
    [left] = harness.cpu_compute(compiled)[-1:]
    assert left.target == "aten.embedding.default" and "Ethos-U55/U65" in left.reason


@pytest.mark.parametrize("flavour", ["fp", "int", "u85"])
def test_embedding_int64_ids_delegate_u85(harness, flavour, tmp_path, et_oracle):
    """TOSA has no int64: int64 ids (Hugging Face's) are cast to int32 on the CPU, an edge conversion like a
    quantize, and the embedding's GATHER runs in the delegate as with int32 ids; the program still takes int64 and
    equals the model (the harness's checks), and ExecuTorch's runtime loads it."""
    from tosakit.partition.partitioner import BOUNDARY_IDS

    torch.manual_seed(0)
    ids = (TOKENS[0].long(),)
    compiled = {"fp": harness.fp, "int": harness.int}.get(flavour, lambda m, i: harness.ethosu(m, i, "ethos-u85-256"))(
        TokenEmbedding().eval(), ids)
    assert any("GATHER" in d.tosa_ops for d in compiled.edge.delegates)
    [cast] = [p for p in compiled.edge.placements if p.placement == "cpu" and "quantize" not in p.target]
    assert cast.target == "aten._to_copy.default" and cast.reason == BOUNDARY_IDS and not cast.compute
    assert not harness.cpu_compute(compiled)
    assert "aten::_to_copy.out" in compiled.program.emitted.kernel_ops
    compiled.program.save(tmp_path / "ids.pte")
    assert et_oracle.load(tmp_path / "ids.pte") == ["forward"]


class PositionIds(nn.Module):
    """RoBERTa's embeddings: position ids computed in int64 from the token ids (padding id 1), a token-type
    table read at those positions (a gather at computed indices), all three embedded."""

    def __init__(self):
        super().__init__()
        self.tokens, self.positions, self.types = nn.Embedding(64, 8), nn.Embedding(40, 8), nn.Embedding(2, 8)
        self.register_buffer("type_ids", torch.arange(40).remainder(2).reshape(1, 40))

    def forward(self, ids):
        mask = ids.ne(1).int()
        positions = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1
        types = torch.gather(self.type_ids.expand(ids.shape[0], -1), 1, positions)
        return self.tokens(ids) + self.positions(positions) + self.types(types)


@pytest.mark.parametrize("flavour", ["int", "u85"])
def test_int64_index_arithmetic_narrows_to_int32_u85(harness, flavour, tmp_path, et_oracle):
    """Index arithmetic on int64 ids (a comparison, a cumulative sum, products and sums, an embedding of the
    result) runs in the delegate in int32: one cast of the ids at the edge, nothing else on the CPU; the program
    equals the model (the harness's checks) and ExecuTorch's runtime loads it."""
    torch.manual_seed(0)
    ids = (torch.tensor([[5, 9, 1, 33, 2, 1, 60, 7]]),)
    compiled = {"fp": harness.fp, "int": harness.int}.get(flavour, lambda m, i: harness.ethosu(m, i, "ethos-u85-256"))(
        PositionIds().eval(), ids)
    assert not harness.cpu_compute(compiled)
    casts = [p for p in compiled.edge.placements if p.placement == "cpu" and "quantize" not in p.target]
    assert [p.target for p in casts] == ["aten._to_copy.default"] and not casts[0].compute
    compiled.program.save(tmp_path / "positions.pte")
    assert et_oracle.load(tmp_path / "positions.pte") == ["forward"]


def test_int64_index_arithmetic_on_the_cpu_in_int32_fp(harness):
    """TOSA's FP profile has no integer arithmetic: the narrowed index ops run on the CPU in int32, the
    embeddings in the delegate, and the program still gives the model's result."""
    from tosakit.runtime import LoadedProgram

    torch.manual_seed(0)
    module, ids = PositionIds().eval(), (torch.tensor([[5, 9, 1, 33, 2, 1, 60, 7]]),)
    compiled = harness.compile(module, ids, "TOSA-1.0+FP", quantize=False)
    assert any("GATHER" in d.tosa_ops for d in compiled.edge.delegates)
    got = LoadedProgram(compiled.program.buffer, "positions.pte", isolate=False).run(list(ids))[0]
    torch.testing.assert_close(got, module(*ids), rtol=0, atol=1e-6)


def test_embedding_int64_ids_stay_on_cpu_with_reason_u55(harness):
    """Ethos-U55 has no GATHER: the embedding stays on the CPU with its int64 ids, no cast added."""
    compiled = harness.compile(TokenEmbedding().eval(), (TOKENS[0].long(),), "ethos-u55-128", quantize=True)
    [left] = harness.cpu_compute(compiled)
    assert left.target == "aten.embedding.default" and "int32" in left.reason
    assert "aten::_to_copy.out" not in compiled.program.emitted.kernel_ops


def test_grouped_conv_is_one_conv2d_per_group(harness):
    compiled = harness.fp(nn.Conv2d(8, 12, 3, 1, 1, groups=4).eval(), seed_inputs((1, 8, 8, 8)))
    [delegate] = compiled.edge.delegates
    assert delegate.tosa_ops["CONV2D"] == 4 and delegate.tosa_ops["CONCAT"] == 1


def _conv_dilations(tosa: bytes) -> set[int]:
    """The dilations of every CONV2D in a TOSA graph."""
    from tosa.Conv2dAttribute import Conv2dAttribute
    from tosa.TosaGraph import TosaGraph

    from tosakit.lower.tosa_graph import Op

    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    found = set()
    for op in (block.Operators(i) for i in range(block.OperatorsLength())):
        if op.Op() == Op.CONV2D:
            attr = Conv2dAttribute()
            attr.Init(op.Attribute().Bytes, op.Attribute().Pos)
            found.update(int(d) for d in attr.DilationAsNumpy())
    return found


def _live_tap_macs(size_hw, kernel, dilation, pad, cin, cout) -> int:
    """MACs of a stride-1 convolution counting only taps that read the input (none of the padding)."""
    live = []
    for size, k, d, p in zip(size_hw, kernel, dilation, pad):
        live.append([sum(0 <= i + t * d - p < size for t in range(k)) for i in range(size + 2 * p - (k - 1) * d)])
    return sum(r * c for r in live[0] for c in live[1]) * cin * cout


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
@pytest.mark.parametrize("rate", [6, 12, 24])
def test_aspp_dilation_multiplies_no_padding_u55_u85(harness, target, rate):
    """DeepLabV3's ASPP 3x3 branches (rates 6, 12, 24 on a 14x14 map) past the NPU's dilation 2: no CONV2D
    keeps a dilation (Vela would run a zero-stuffed (2r+1)x(2r+1) kernel), and Vela's MAC count is exactly the
    products of taps that read the input (rate 24: the centre tap alone). Every op on the NPU, integers as the
    fake-quantized model's."""
    module = nn.Conv2d(8, 16, 3, 1, rate, dilation=rate).eval()
    compiled = harness.ethosu(module, seed_inputs((1, 8, 14, 14)), target)
    [delegate] = compiled.edge.delegates
    conv_macs = sum(o.macs for o in delegate.report.per_op if o.tosa_op == "CONV2D")  # (Vela counts copies too)
    assert conv_macs == _live_tap_macs((14, 14), (3, 3), (rate, rate), (rate, rate), 8, 16)
    [(tosa, _)] = ethosu_delegates(compiled)
    assert _conv_dilations(tosa) == {1}


@pytest.mark.parametrize("module, why", [
    (nn.ConvTranspose2d(4, 4, 3, 2, groups=2), "groups=2"),
    (nn.ConvTranspose2d(4, 4, 3, 1, dilation=2), "dilation"),
], ids=["groups", "dilation"])
def test_conv_transpose2d_limits_refused_with_reason(harness, module, why):
    compiled = harness.compile(module.eval(), seed_inputs((1, 4, 5, 5)), "TOSA-1.0+FP", quantize=False)
    [left] = harness.cpu_compute(compiled)
    assert left.target == "aten.convolution.default" and why in left.reason


PHASED = ["conv_transpose2d", "conv_transpose2d_k4s2", "conv_transpose2d_s1", "conv_transpose2d_s3",
          "conv_transpose2d_s3x2", "conv_transpose2d_k2s3"]


def test_conv_transpose2d_stride3_delegated_on_u55(harness):
    """Stride 3 on ethos-u55-128 runs whole on the NPU as one stride-1 CONV2D per row phase; Ethos-U85 keeps
    its TRANSPOSE_CONV2D."""
    module, inputs = TABLE.build("conv_transpose2d_s3")
    u55 = harness.compile(module, inputs, "ethos-u55-128", quantize=True)
    harness.assert_delegated(u55)
    [delegate] = u55.edge.delegates
    assert delegate.tosa_ops["CONV2D"] == 3 and "TRANSPOSE_CONV2D" not in delegate.tosa_ops
    assert delegate.report.cpu_ops == 0
    [u85] = harness.compile(module, inputs, "ethos-u85-256", quantize=True).edge.delegates
    assert u85.tosa_ops["TRANSPOSE_CONV2D"] == 1 and "CONV2D" not in u85.tosa_ops


@pytest.mark.parametrize("config", ["a8w8", "a16w8"])
@pytest.mark.parametrize("name", PHASED)
def test_conv_transpose2d_phases_equal_transpose_conv2d(harness, name, config):
    """The sub-pixel form (TOSA-1.0+INT+u55) gives the integers TRANSPOSE_CONV2D (TOSA-1.0+INT) gives: the
    same accumulator sums, the same RESCALE."""
    from tosakit.quantize import get_symmetric_a16w8_quantization_config
    from tosakit.runtime import run_edge

    module, inputs = TABLE.build(name)
    kw = {"config": get_symmetric_a16w8_quantization_config()} if config == "a16w8" else {}
    plain, phased = (harness.compile(module, inputs, target, quantize=True, **kw)
                     for target in ("TOSA-1.0+INT", "TOSA-1.0+INT+u55"))
    assert "TRANSPOSE_CONV2D" in plain.edge.delegates[0].tosa_ops
    assert "TRANSPOSE_CONV2D" not in phased.edge.delegates[0].tosa_ops
    for a, b in zip(run_edge(plain.edge, *inputs), run_edge(phased.edge, *inputs)):
        assert torch.equal(a, b)


class SwinHead(nn.Module):
    """torchvision's Swin head: a norm over channels-last features (rolled, as its shifted windows roll them),
    permuted to channels first, then global average pooling and the classifier."""

    def __init__(self):
        super().__init__()
        self.norm, self.pool, self.fc = nn.LayerNorm(8), nn.AdaptiveAvgPool2d(1), nn.Linear(8, 4)

    def forward(self, x):
        x = torch.roll(self.norm(x), 1, 1).permute(0, 3, 1, 2)
        return self.fc(torch.flatten(self.pool(x), 1))


def test_pooling_a_permuted_feature_map_delegates_whole_u85(harness):
    """Decomposing the adaptive pool of a channels-last tensor restrides its [1, C, 1, 1] mean with an
    as_strided that changes no value: capture drops it (torchvision:swin_t left it, and the mean before it, on the
    CPU), and the model runs whole on the NPU, integers as the fake-quantized model's (on a 3x3 map: over an even
    count AVG_POOL2D rounds an exact tie up where torch rounds it to even, a step the classifier then widens)."""
    from tosakit.capture import capture, export

    module, inputs = SwinHead().eval(), seed_inputs((1, 3, 3, 8))
    graph = capture(export(module, inputs)).graph_module.graph
    assert not [n for n in graph.nodes if n.target == torch.ops.aten.as_strided.default]
    harness.ethosu(module, inputs, "ethos-u85-256")
