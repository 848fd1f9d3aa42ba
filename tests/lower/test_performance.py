"""Lowering that keeps the NPU busy (no needless TRANSPOSE or RESHAPE), and Vela's memory limits enforced.
Cycle counts themselves are benchmarks (bench/run.py zoo), not tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from tosa.TosaGraph import TosaGraph as TosaFlatbuffer

from support.npu import ethosu_blobs
from tosakit import EthosUCompileSpec, TosakitError
from tosakit.backends.ethosu import compile_tosa, fastest_form
from tosakit.flow import compile
from tosakit.lower.lowering import tosa_pads
from tosakit.lower.rules.conv import StemCase
from tosakit.lower.tosa_graph import DType, Op, TosaGraph
from tosakit.lower.transpose import FORMS, transpose_case
from tosakit.runtime import check_delegates
from tosakit.runtime.tosa_inprocess import run_tosa

pytestmark = pytest.mark.numerics


class Conv1dChain(nn.Module):
    """The shape of a 1-D keyword spotter: every conv1d is a view, a CONV2D, and a view back."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv1d(8, 16, 5, 2, 2), nn.ReLU(), nn.Conv1d(16, 16, 3, 1, 1, groups=16),
                                  nn.ReLU(), nn.Conv1d(16, 24, 1), nn.ReLU())
        self.fc = nn.Linear(24, 4)

    def forward(self, x):
        return self.fc(self.body(x).mean(-1))


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_conv1d_chain_keeps_channels_last_u55_u85(target):
    """Between conv1d layers the data stays channels last: one TRANSPOSE (the NCL input), no other, and the
    integer result still matches the fake-quantized model."""
    model, inputs = Conv1dChain().eval(), (torch.randn(1, 8, 40),)
    compiled = compile(model, inputs, target, quantize=True)
    [delegate] = compiled.edge.delegates
    assert delegate.tosa_ops.get("TRANSPOSE", 0) == 1, delegate.tosa_ops
    assert delegate.report.cpu_ops == 0
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


def test_linear_is_one_reshape_each_side_int():
    """A linear layer on [1, features] is RESHAPE, CONV2D 1x1, RESHAPE: no TRANSPOSE, no reshape chains."""
    model, inputs = nn.Sequential(nn.Linear(32, 10)).eval(), (torch.randn(1, 32),)
    compiled = compile(model, inputs, "TOSA-1.0+INT", quantize=True)
    [delegate] = compiled.edge.delegates
    assert delegate.tosa_ops.get("RESHAPE") == 2 and "TRANSPOSE" not in delegate.tosa_ops
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


def test_sram_beyond_the_arena_cache_is_a_clear_error_u55():
    """Vela silently overruns a too-small arena; tosakit refuses, naming the need and the limit."""
    model, inputs = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU()).eval(), (torch.randn(1, 3, 32, 32),)
    spec = EthosUCompileSpec("ethos-u55-128", extra_flags=["--arena-cache-size=1024"])
    with pytest.raises(TosakitError) as err:
        compile(model, inputs, spec, quantize=True)
    message = str(err.value)
    assert "KiB of SRAM" in message and "1.0 KiB that Shared_Sram" in message and "--optimise Size" in message
    roomy = EthosUCompileSpec("ethos-u55-128", extra_flags=["--arena-cache-size=1048576"])
    [delegate] = compile(model, inputs, roomy, quantize=True).edge.delegates
    assert 0 < delegate.report.sram_used_bytes <= 1048576


def test_optimise_size_uses_no_more_sram_u85():
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(32, 8, 1)).eval()
    inputs = (torch.randn(1, 3, 64, 64),)
    sram = {}
    for goal in ("Performance", "Size"):
        spec = EthosUCompileSpec("ethos-u85-256", extra_flags=[f"--optimise={goal}"])
        sram[goal] = compile(model, inputs, spec, quantize=True).edge.delegates[0].report.sram_used_bytes
    assert sram["Size"] <= sram["Performance"]


@pytest.mark.parametrize("int8_io", [False, True], ids=["float_io", "int8_io"])
def test_channels_last_export_has_no_boundary_transpose_u55(tmp_path, et_oracle, int8_io):
    """A model exported with channels-last inputs keeps NHWC across the delegate boundary: the .pte records
    the dim order [0, 2, 3, 1], the TOSA has no TRANSPOSE, the host run matches, ExecuTorch loads it."""
    from tosakit.program.pte import deserialize_pte
    from tosakit.runtime import LoadedProgram, run_edge

    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(1, 3, 16, 16).to(memory_format=torch.channels_last)
    spec = EthosUCompileSpec("ethos-u55-128").with_debug_info()
    compiled = compile(model, (x,), spec.with_int8_io() if int8_io else spec, quantize=True)
    [delegate] = compiled.edge.delegates
    assert "TRANSPOSE" not in delegate.tosa_ops and delegate.tosa_ops["CONV2D"] == 2
    if int8_io:
        x = compiled.edge.io_quantization["inputs"][0].quantize(x)
    assert all(c.passed for c in check_delegates(compiled.edge, (x,)))
    prog, _ = deserialize_pte(compiled.program.buffer)
    plan = prog.execution_plan[0]
    assert [list(plan.values[i].val.dim_order) for i in (*plan.inputs, *plan.outputs)] == [[0, 2, 3, 1]] * 2
    [got] = LoadedProgram(compiled.program.buffer, "cl.pte").run([x])
    [want] = run_edge(compiled.edge, x)
    assert torch.equal(got, want)
    path = tmp_path / "cl.pte"
    path.write_bytes(compiled.program.buffer)
    assert et_oracle.load(path) == ["forward"]


class SmallCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.conv1d = nn.Conv1d(8, 4, 1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        y = nn.functional.relu6(self.conv(x), inplace=True)
        y = nn.functional.relu(self.dw(y), inplace=True)
        y = nn.functional.adaptive_avg_pool2d(nn.functional.dropout(y, 0.2, training=False), 1)
        y = self.conv1d(torch.flatten(y, 2))
        return self.fc(torch.flatten(y, 1))


def _signature(graph) -> list:
    names, out = {}, []
    for i, n in enumerate(n for n in graph.nodes if n.op in ("placeholder", "call_function", "output")):
        names[n] = f"v{i}"
        out.append((n.name, str(n.target), str(torch.fx.node.map_arg(n.args, lambda a: names.get(a, a.name)))))
    return out


def test_direct_core_aten_is_what_decomposing_gives():
    """The fast path (rewriting conv2d/conv1d, in-place activations, dropout, flatten and global pooling in
    place) yields exactly the graph run_decompositions does, node names included (reports show them);
    anything else takes the full path."""
    from tosakit.capture import direct_core_aten, export, to_core_aten

    ep = export(SmallCnn().eval(), (torch.randn(1, 3, 16, 16),))
    fast = direct_core_aten(ep)
    assert fast is not None
    assert _signature(fast.graph) == _signature(to_core_aten(ep).graph)
    assert "conv2d" in str(list(ep.graph.nodes))  # the user's program is left as it was

    class ReadBeforeInPlace(nn.Module):
        def forward(self, x):
            y = x * 2
            w = y + 1  # y has another reader: the rewrite leaves it to a real decomposition
            return torch.relu_(y) + w

    class Matmul(nn.Module):
        def forward(self, a, b):
            return torch.matmul(a, b)  # decomposes into views and bmm: not one of the direct rewrites

    assert direct_core_aten(export(ReadBeforeInPlace(), (torch.randn(4),))) is None
    assert direct_core_aten(export(Matmul(), (torch.randn(2, 3, 4), torch.randn(2, 4, 5)))) is None


class StacksAndPools(nn.Module):
    """stack along an inner, the first and a new last axis, and max pools, between other views, cats and
    getitems: decomposing them shifts the numbers in every later node's name."""

    def forward(self, x):
        a = x.view(2, 48).view(2, 3, 16)
        s = torch.stack([a, a + 1], 1)
        t = torch.stack([a.unsqueeze(0), a.unsqueeze(0)]).view(-1)
        u = torch.stack((a, a * 2, a), dim=-1)
        p = nn.functional.max_pool2d(x, 2)
        q = nn.functional.max_pool2d(x, 3, 1, 1, 1, True)
        first, second = torch.cat([x, x], 1).split([3, 3], 1)
        return s, t, u, torch.stack([p, p], -2), q + second, first * 2


def test_direct_core_aten_stacks_and_pools_are_what_decomposing_gives():
    """stack and max_pool2d (LSTM, GRU and CRNN graphs hold them) become what torch's own decompositions make,
    named as a re-trace names them, with the same values; a quantized GRU, the common case, too."""
    from tosakit.capture import direct_core_aten, export, to_core_aten
    from tosakit.flow import quantize_model
    from tosakit.specs import compile_spec_for_target

    class Gru(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.GRU(8, 8, batch_first=True)

        def forward(self, x):
            return self.rnn(x)[0]

    torch.manual_seed(0)
    x, seq = torch.randn(2, 3, 4, 4), torch.randn(1, 3, 8)
    for ep in (export(StacksAndPools(), (x,)),
               export(quantize_model(Gru().eval(), (seq,), compile_spec_for_target("TOSA-1.0+INT")), (seq,))):
        fast, full = direct_core_aten(ep), to_core_aten(ep).graph_module
        assert fast is not None
        assert _signature(fast.graph) == _signature(full.graph)
        for a, b in zip(fast.graph.nodes, full.graph.nodes):
            va, vb = a.meta.get("val"), b.meta.get("val")
            if isinstance(vb, torch.Tensor):
                assert (va.shape, va.stride(), va.dtype) == (vb.shape, vb.stride(), vb.dtype), a.name
    assert "stack" in str(list(ep.graph.nodes))  # the user's program is left as it was


BLOCK_SWAPS = [((1, 3, 6, 5), (0, 2, 3, 1)), ((1, 5, 6, 3), (0, 3, 1, 2)), ((2, 4, 3), (0, 2, 1)), ((4, 7), (1, 0)),
               ((2, 3, 1, 4), (0, 3, 2, 1))]


@pytest.mark.parametrize("dtype", [DType.INT8, DType.INT16], ids=["int8", "int16"])
@pytest.mark.parametrize("shape,perms", BLOCK_SWAPS, ids=[str(p) for _, p in BLOCK_SWAPS])
def test_transpose_forms_are_exact_int(shape, perms, dtype):
    """Every form of a block-swapping TRANSPOSE gives the TRANSPOSE's result bit for bit in the TOSA reference
    model, the dtype's extremes included (the elementwise form's MUL by one and unit RESCALE are exact)."""
    case = transpose_case(shape, perms, dtype)
    assert {"transpose", "block_swap", "elementwise_swap"} <= set(case.forms) <= set(FORMS)
    info = np.iinfo(np.int8 if dtype == DType.INT8 else np.int16)
    x = np.random.default_rng(0).integers(info.min, info.max + 1, size=shape).astype(info.dtype)
    x.flat[:2] = info.min, info.max
    for form in case.forms:
        [got] = run_tosa(case.candidate(form), [x])
        np.testing.assert_array_equal(got, np.transpose(x, perms), err_msg=form)


REDUCIBLE = [((1, 1, 32, 2, 16), (0, 3, 1, 2, 4), (32, 2, 16), (1, 0, 2)), ((1, 32, 4, 16), (0, 2, 3, 1), (32, 64), (1, 0)),
             ((2, 3, 4), (2, 1, 0), (2, 3, 4), (2, 1, 0)), ((1, 5, 1), (2, 1, 0), (5,), (0,))]


@pytest.mark.parametrize("shape,perms,low,low_perms", REDUCIBLE, ids=[str(r[1]) for r in REDUCIBLE])
def test_transpose_is_emitted_at_its_lowest_rank_int(shape, perms, low, low_perms):
    """Size-1 dims dropped and neighbours merged: the ``reduced`` form (a form only where the rank drops) holds
    the low-rank TRANSPOSE (none for a mere view) and gives np.transpose's result bit for bit."""
    from tosakit.lower.transpose import reduced

    assert reduced(shape, perms) == (low, low_perms)
    case = transpose_case(shape, perms, DType.INT32)
    assert ("reduced" in case.forms) == (low != shape)
    x = np.arange(math.prod(shape), dtype=np.int32).reshape(shape)
    for form in case.forms:
        [got] = run_tosa(case.candidate(form), [x])
        np.testing.assert_array_equal(got, np.transpose(x, perms), err_msg=form)


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_grouped_query_attention_moves_no_5d_block_u55_u85(target):
    """Keys transposed per head, then repeated for each query head (Llama's repeat_kv): the TRANSPOSE runs on the
    keys before the TILE, at rank 3 (Vela split the 5-D one into ten operations, 28,680 cycles on ethos-u85-256
    against 1,600)."""
    class RepeatKv(nn.Module):
        def forward(self, k):
            k = k.transpose(1, 2)[:, :, None].expand(1, 2, 2, 32, 16).reshape(1, 4, 32, 16)
            return k * 2

    compiled = compile(RepeatKv().eval(), (torch.randn(1, 32, 2, 16),), target, quantize=True)
    [delegate] = compiled.edge.delegates
    assert delegate.tosa_ops.get("TRANSPOSE") == 1 and delegate.report.total_cycles < 6000, delegate.report.summary()
    assert all(c.passed for c in check_delegates(compiled.edge, (torch.randn(1, 32, 2, 16),)))


class ChannelShuffle(nn.Module):
    """ShuffleNetV2's unit: half the channels through a branch, the halves joined and shuffled."""

    def __init__(self):
        super().__init__()
        self.stem, self.branch = nn.Conv2d(3, 16, 1), nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU())

    def forward(self, x):
        a, b = self.stem(x).chunk(2, dim=1)
        y = torch.cat([a, self.branch(b)], 1)
        return y.view(1, 2, 8, 6, 6).transpose(1, 2).reshape(1, 16, 6, 6).chunk(2, dim=1)[0] * 2


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_channel_shuffle_is_one_transpose_in_each_pixel_u55_u85(target):
    """Channels last, the shuffle's views split and merge the channels of each pixel: one TRANSPOSE swaps the
    groups in place (the input's and the output's layout changes are the other two), where going through channels
    first took two whole-tensor ones more; the result still matches the fake-quantized model."""
    inputs = (torch.randn(1, 3, 6, 6),)
    compiled = compile(ChannelShuffle().eval(), inputs, target, quantize=True)
    [delegate] = compiled.edge.delegates
    assert delegate.tosa_ops.get("TRANSPOSE") == 3, delegate.tosa_ops
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


class GroupedConvRelu(nn.Module):
    """RegNet's grouped 3x3 conv, batch norm and ReLU, then a 1x1 conv."""

    def __init__(self):
        super().__init__()
        self.grouped = nn.Sequential(nn.Conv2d(128, 128, 3, padding=1, groups=16), nn.BatchNorm2d(128), nn.ReLU())
        self.pointwise = nn.Conv2d(128, 32, 1)

    def forward(self, x):
        return self.pointwise(self.grouped(x))


def test_relu_that_the_rescale_already_saturates_is_no_clamp_u85():
    """A ReLU whose quantized range starts at 0 clamps nothing the RESCALE leaves: no CLAMP after each group's
    convolution (with them, Vela could not write the groups into their concatenation: 23,206 cycles, now about
    10,500 on ethos-u85-256), and the program still matches the fake-quantized model."""
    inputs = (torch.randn(1, 128, 7, 7),)
    compiled = compile(GroupedConvRelu().eval(), inputs, "ethos-u85-256", quantize=True)
    [delegate] = compiled.edge.delegates
    assert "CLAMP" not in delegate.tosa_ops and delegate.report.total_cycles < 15000, delegate.report.summary()
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


def _ethosu_tosa(compiled):
    """The TOSA block of a program's one Ethos-U delegate, its operators, and its tensors' shapes by name."""
    [(tosa, _)] = ethosu_blobs(compiled)
    block = TosaFlatbuffer.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    shapes = {block.Tensors(i).Name().decode(): tuple(block.Tensors(i).ShapeAsNumpy()) for i in
              range(block.TensorsLength())}
    return block, [block.Operators(i) for i in range(block.OperatorsLength())], shapes


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_activation_after_a_reshape_runs_inside_the_convolution_u55_u85(target):
    """PVT v2's GELU reads its depthwise convolution's output flattened to tokens: its TABLE goes before that
    RESHAPE, so Vela runs it as the convolution's activation (3 NPU operations, not 4; timm's pvt_v2_b0 on
    ethos-u85-256: 54 TABLEs, 1.39 M of 17.1 M cycles), no unread RESHAPE is left in the TOSA, and the program
    still matches the fake-quantized model."""
    from support.op_tables.layers import ConvMlp

    inputs = (torch.randn(1, 196, 32),)
    compiled = compile(ConvMlp(32, 64, 14).eval(), inputs, target, quantize=True)
    [delegate] = compiled.edge.delegates
    assert delegate.tosa_ops["TABLE"] == 1 and delegate.report.npu_ops == 3, delegate.report.summary()
    block, ops, _ = _ethosu_tosa(compiled)
    read = {op.Inputs(j).decode() for op in ops for j in range(op.InputsLength())}
    read |= {block.Outputs(j).decode() for j in range(block.OutputsLength())}
    assert all(op.Outputs(0).decode() in read for op in ops), "an op nothing reads"
    [table] = [op for op in ops if op.Op() == Op.TABLE]
    producer = {op.Outputs(0).decode(): op.Op() for op in ops}
    assert producer[table.Inputs(0).decode()] == Op.RESCALE
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


class ChannelsLastMlp(nn.Module):
    """ConvNeXt's MLP (Hugging Face's): linear layers over a feature map permuted to channels last, GELU between."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(nn.functional.gelu(self.fc1(x.permute(0, 2, 3, 1)))).permute(0, 3, 1, 2)


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_activation_after_a_linear_over_a_feature_map_is_fused_u55_u85(target):
    """A linear layer over a [1, 16, 16, C] feature map is a [256, 1, 1, C] convolution, then a RESHAPE back: its
    GELU stays after that RESHAPE, where Vela fuses it (before it, on the batch of rows, Vela runs the TABLE on its
    own: hf:tiny/convnext on ethos-u55-128 0.77x of ExecuTorch's cycles became 0.83x), and the program matches
    the fake-quantized model."""
    inputs = (torch.randn(1, 16, 16, 16),)
    compiled = compile(ChannelsLastMlp().eval(), inputs, target, quantize=True)
    [delegate] = compiled.edge.delegates
    tables = [o.cycles for o in delegate.report.per_op if o.tosa_op == "TABLE"]
    assert tables == [0], delegate.report.summary()
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


class OneHeadScores(nn.Module):
    """PVT v2's attention in its first stage: one head, scores [1, 1, tokens, keys], softmax over the keys."""

    def forward(self, q, k):
        return torch.softmax(q @ k.transpose(-1, -2) * 0.125, dim=-1)


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_one_heads_scores_keep_the_keys_innermost_u55_u85(target):
    """Scores with one head ([1, 1, 196, 49]) are no feature map: the softmax runs with the 49 keys as the NPU's
    depth, not over [1, 196, 49, 1] with a depth of 1 (its SUB took 4 cycles an element, timm's pvt_v2_b0: 614,656
    cycles each), and the program matches the fake-quantized model."""
    inputs = (torch.randn(1, 1, 196, 32), torch.randn(1, 1, 49, 32))
    compiled = compile(OneHeadScores().eval(), inputs, target, quantize=True)
    _, ops, shapes = _ethosu_tosa(compiled)
    subs = [shapes[op.Outputs(0).decode()] for op in ops if op.Op() == Op.SUB]
    assert subs and all(s[-1] == 49 for s in subs), subs
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


class GroupNormStem(nn.Module):
    """ResNetV2's stem (timm's hybrid ViTs): a convolution, then a group norm, whose per-channel scale and shift
    broadcast over a channels-first [1, 32, 56, 56] feature map."""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(3, 32, 3, 2, 1), nn.GroupNorm(8, 32)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        return self.norm(self.conv(x))


def test_a_constant_broadcast_over_two_dims_merges_them_u55():
    """Ethos-U55 reads a constant broadcast over two dims again and again (Vela: 8 cycles an element, bound by
    flash): the group norm's scale and shift multiply and add with the broadcast dims merged ([1, 32, 1] against
    [1, 32, 3136]: about 2.17 M cycles before, 0.70 M now; timm's vit_tiny_r_s16_p8_224 1.001x to 0.888x of
    ExecuTorch's), and the program matches the fake-quantized model. Ethos-U85, as fast in any shape, keeps them."""
    inputs = (torch.randn(1, 3, 112, 112),)
    cycles = {}
    for target in ("ethos-u55-128", "ethos-u85-256"):
        compiled = compile(GroupNormStem().eval(), inputs, target, quantize=True)
        _, ops, shapes = _ethosu_tosa(compiled)
        ranks = [len(shapes[op.Outputs(0).decode()]) for op in ops if op.Op() in (Op.MUL, Op.ADD)]
        assert (min(ranks) == 2) == (target == "ethos-u55-128"), ranks
        cycles[target] = compiled.edge.delegates[0].report.total_cycles
        assert all(c.passed for c in check_delegates(compiled.edge, inputs))
    assert cycles["ethos-u55-128"] < 1_000_000, cycles


def test_prune_drops_what_no_output_reads_int():
    """An op left unread, and the constants only it read, leave the TOSA; the rest runs as before (the reference
    model gives the same result), and a graph with nothing unread serializes to the same bytes."""
    def build(dead: bool) -> TosaGraph:
        g = TosaGraph()
        x = g.input((1, 4), DType.INT8)
        if dead:
            g.op(Op.RESHAPE, [x, g.shape_const([4, 1])], (4, 1), DType.INT8)
        g.output(g.op(Op.NEGATE, [x, g.zero_point(3, DType.INT8), g.zero_point(-2, DType.INT8)], (1, 4), DType.INT8))
        return g

    kept, pruned = build(False), build(True)
    before = kept.serialize()
    kept.prune()
    assert kept.serialize() == before
    assert [o.op for o in pruned.needed()] == ["NEGATE"] and len(pruned.ops) == 2
    pruned.prune()
    assert [o.op for o in pruned.ops] == ["NEGATE"]
    block = TosaFlatbuffer.GetRootAs(pruned.serialize(), 0).Regions(0).Blocks(0)
    assert [block.Operators(i).Op() for i in range(block.OperatorsLength())].count(Op.RESHAPE) == 0
    assert block.TensorsLength() == 4 and block.ShapesLength() == 0
    x = np.arange(-2, 2, dtype=np.int8).reshape(1, 4)
    [a], [b] = run_tosa(before, [x]), run_tosa(pruned.serialize(), [x])
    assert np.array_equal(a, b) and np.array_equal(a, -(x.astype(np.int32) - 3) - 2)


class UnfoldedLayerNorm(nn.Module):
    """MobileViT's unfolding of a feature map into patches ([C, N, P] stored, [P, N, C] in torch), then the layer
    norm over C."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(32, 32, 1)
        self.norm = nn.LayerNorm(32)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.2, 0.2)

    def forward(self, x):
        f = self.conv(x)
        b, c = f.shape[:2]
        p = f.reshape(b * c * 4, 2, 4, 2).transpose(1, 2).reshape(b, c, 16, 4).transpose(1, 3).reshape(4, 16, c)
        return self.norm(p)


def test_layer_norm_of_features_stored_outermost_moves_them_first_u55():
    """The features a layer norm reduces, stored outermost (a transpose still pending), move to torch order once
    before it, for the mean and every step after: no step broadcasts a per-feature constant across the inner
    dims (290,944 cycles on ethos-u55-128 before, about 28,000 now); the program matches the fake-quantized model."""
    inputs = (torch.randn(1, 32, 8, 8),)
    compiled = compile(UnfoldedLayerNorm().eval(), inputs, "ethos-u55-128", quantize=True)
    [delegate] = compiled.edge.delegates
    assert delegate.report.total_cycles < 60000, delegate.report.summary()
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


def test_a_transpose_that_is_no_block_swap_keeps_one_form_int():
    """Swapping heads and tokens between batch and features ([0, 2, 1, 3]) is not a block swap: a TRANSPOSE
    (at its own rank or without the batch)."""
    assert transpose_case((1, 4, 8, 16), (0, 2, 1, 3), DType.INT8).forms == ("transpose", "reduced")
    assert transpose_case((2, 4, 8, 16), (0, 2, 1, 3), DType.INT8).forms == ("transpose",)
    assert transpose_case((1, 3, 8, 8), (0, 2, 3, 1), DType.INT32).forms == FORMS[:3]  # no exact MUL for int32


@pytest.mark.parametrize("target,form", [("ethos-u55-128", "block_swap"), ("ethos-u85-256", "elementwise_swap")])
def test_image_input_transpose_takes_the_fastest_form_u55_u85(target, form):
    """NCHW -> NHWC of a 3x224x224 image: the form Vela estimates fastest is picked, at most half the plain
    TRANSPOSE's cycles (U55 moves a block swap in half the cycles; U85 streams it from an elementwise op)."""
    case = transpose_case((1, 3, 224, 224), (0, 2, 3, 1), DType.INT8)
    spec = EthosUCompileSpec(target)
    cycles = {f: compile_tosa(case.candidate(f), spec).report.total_cycles for f in case.forms}
    chosen = fastest_form(spec)(case)
    assert cycles[chosen] == min(cycles.values()) == cycles[form] <= cycles["transpose"] / 2, cycles


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_conv_net_with_chosen_transposes_matches_u55_u85(target):
    """A quantized NCHW conv net lowers its boundary TRANSPOSEs in the chosen forms and still matches the
    fake-quantized model through the TOSA reference model."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    inputs = (torch.randn(1, 3, 64, 64),)
    compiled = compile(model, inputs, target, quantize=True)
    [delegate] = compiled.edge.delegates
    assert delegate.report.cpu_ops == 0
    assert ("MUL" in delegate.tosa_ops) == (target == "ethos-u85-256"), delegate.tosa_ops
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


def test_weight_streaming_layer_is_reported_flash_bound_u55():
    """A 512x512 linear layer on U55 Shared_Sram waits on its weights in off-chip flash: the per-op row and the
    summary say so (a conv on a large image is NPU-bound)."""
    model = nn.Sequential(nn.Linear(512, 512)).eval()
    [delegate] = compile(model, (torch.randn(1, 512),), "ethos-u55-128", quantize=True).edge.delegates
    [fc] = [o for o in delegate.report.per_op if o.tosa_op == "CONV2D"]
    assert fc.bound_by == "Off-chip Flash" and fc.cycles > fc.npu_cycles
    assert "cycles bound by: Off-chip Flash" in delegate.report.summary()
    assert "Sram_Only" in delegate.report.memory_hint
    conv = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1)).eval()
    [delegate] = compile(conv, (torch.randn(1, 16, 64, 64),), "ethos-u55-128", quantize=True).edge.delegates
    assert [o.bound_by for o in delegate.report.per_op if o.tosa_op == "CONV2D"] == ["NPU"]
    assert delegate.report.memory_hint is None


STEMS = [(16, 3, 3, 1, DType.INT8), (32, 3, 7, 3, DType.INT8), (16, 2, 2, 0, DType.INT8), (18, 1, 5, 2, DType.INT8),
         (16, 4, 4, 1, DType.INT16), (20, 3, 3, 1, DType.INT16),
         (16, 3, 7, 0, DType.INT8)]  # SqueezeNet's: the last row and column reach no window (negative far pads)


@pytest.mark.parametrize("size,channels,kernel,pad,dtype", STEMS, ids=[f"k{s[2]}p{s[3]}c{s[1]}" for s in STEMS])
def test_stem_forms_are_exact_int(size, channels, kernel, pad, dtype):
    """A stride-2 stem convolution and its space-to-depth forms (patches swapped into channels, a stride-1
    convolution with rearranged weights) give the same integers in the TOSA reference model."""
    pads = tuple(tosa_pads((size, size), (kernel, kernel), (2, 2), (pad, pad)))
    case = StemCase((1, size, size, channels), (kernel, kernel), 8, pads, dtype)
    assert case.applies() and case.forms[0] == "conv" and len(case.forms) >= 4  # space to depth, each transpose form
    info = np.iinfo(np.int8 if dtype == DType.INT8 else np.int16)
    x = np.random.default_rng(1).integers(info.min, info.max + 1, (1, size, size, channels)).astype(info.dtype)
    reached = x[:, :size + min(pads[1], 0), :size + min(pads[3], 0)]  # the plain form crops the rest
    [want] = run_tosa(case.candidate("conv"), [reached])
    assert np.count_nonzero(want) > want.size // 2
    for form in case.forms[1:]:
        [got] = run_tosa(case.candidate(form), [x])
        np.testing.assert_array_equal(got, want, err_msg=form)


class Stem(nn.Module):
    """An image network's first layers: a 7x7 stride-2 convolution over RGB, then a 3x3 one."""

    def __init__(self, pad=3):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 16, 7, 2, pad), nn.ReLU(), nn.Conv2d(16, 16, 3, 1, 1))

    def forward(self, x):
        return self.body(x)


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
@pytest.mark.parametrize("pad,out", [(3, 48), (0, 45)])
def test_image_stem_runs_as_space_to_depth_u55_u85(target, pad, out):
    """Vela estimates the 7x7 RGB stem faster over 2x2 patches: the delegate's first CONV2D reads 12 channels,
    and the program still matches the fake-quantized model. Unpadded (SqueezeNet's), the last row and column
    reach no window: the patches' convolution leaves them out (it was left in its plain form)."""
    inputs = (torch.randn(1, 3, 96, 96),)
    compiled = compile(Stem(pad).eval(), inputs, target, quantize=True)
    [delegate] = compiled.edge.delegates
    assert delegate.report.cpu_ops == 0
    convs = [o for o in delegate.report.per_op if o.tosa_op == "CONV2D"]
    assert len(convs) == 2 and convs[0].macs == out * out * 16 * 4 * 4 * 12, convs[0]
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"])
def test_grouped_stride_2_convolution_reads_its_groups_in_place_u55_u85(target):
    """A grouped stride-2 convolution of 4 channels a group (RegNetZ's) keeps each group's SLICE as Vela reads it,
    in place: the stem's space-to-depth form (a TRANSPOSE per group, the SLICE then copied) is for whole inputs
    (timm:regnetz_005 on U55 took 1.14x ExecuTorch's cycles, 3.9 M of them in 2,904 SLICEs)."""
    model = nn.Sequential(nn.Conv2d(8, 64, 1), nn.ReLU(), nn.Conv2d(64, 64, 3, 2, 1, groups=16)).eval()
    inputs = (torch.randn(1, 8, 32, 32),)
    compiled = compile(model, inputs, target, quantize=True)
    [delegate] = compiled.edge.delegates
    ops = [o.tosa_op for o in delegate.report.per_op]
    assert ops.count("CONV2D") == 17 and ops.count("TRANSPOSE") <= 2, ops  # the model input and output layouts
    assert all(c.passed for c in check_delegates(compiled.edge, inputs))


def test_weight_streaming_hint_in_dedicated_sram_u85():
    """Weights already cached (Dedicated_Sram) and still the bound: the hint does not suggest the mode in use."""
    from tosakit.specs import EthosUCompileSpec

    model = nn.Sequential(nn.Linear(1024, 1024), nn.Linear(1024, 1024)).eval()
    spec = EthosUCompileSpec("ethos-u85-256", system_config="Ethos_U85_SYS_DRAM_Mid", memory_mode="Dedicated_Sram_384KB")
    [delegate] = compile(model, (torch.randn(1, 1024),), spec, quantize=True).edge.delegates
    hint = delegate.report.memory_hint
    assert hint and "read once per inference" in hint and "Dedicated_Sram caches" not in hint, hint


def test_an_export_compiled_for_several_targets_is_decomposed_once(monkeypatch):
    """Compiling one exported program for several targets decomposes it to core ATen once (a third of a second a
    time); each compile still gets its own graph, and the programs are those of fresh exports."""
    from tosakit.capture import core_aten, export
    from tosakit.flow import compile

    class Matmul(nn.Module):
        def forward(self, a, b):
            return torch.relu(torch.matmul(a, b))  # not one of the direct rewrites: decomposed

    inputs = (torch.randn(2, 3, 4), torch.randn(2, 4, 5))
    ep = export(Matmul(), inputs)
    calls = []
    real = core_aten.to_core_aten
    monkeypatch.setattr(core_aten, "to_core_aten", lambda *a: calls.append(1) or real(*a))
    first = [compile(ep, inputs, target).program.buffer for target in ("TOSA-1.0+FP", "vgf", "TOSA-1.0+FP")]
    assert len(calls) == 1 and first[0] == first[2]
    assert [compile(export(Matmul(), inputs), inputs, t).program.buffer for t in ("TOSA-1.0+FP", "vgf")] \
        == first[:2] and len(calls) == 3
