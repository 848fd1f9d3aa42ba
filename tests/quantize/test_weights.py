"""Weights that fit the NPU: a8w4 (int8 activations, weights in -7..7), lowered as TOSA INT4 where the target has
the int4 extension, and what Vela makes of them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support.npu import assert_npu_bit_exact, ethosu_delegates

from tosakit import get_symmetric_a8w4_quantization_config
from tosakit.flow import compile
from tosakit.lower.tosa_graph import Op
from tosakit.runtime import evaluate_exact, run_edge


def _convs():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 10)).eval()
    return model, (torch.randn(1, 16, 8, 8),)


def _a8w4(target, model, inputs):
    return compile(model, inputs, target, quantize=True, config=get_symmetric_a8w4_quantization_config(is_qat=False))


def _weights(tosa: bytes) -> list[tuple[str, np.ndarray | None, str]]:
    """(weight dtype name, weight values when int8, weight zero point dtype name) of each CONV2D and
    DEPTHWISE_CONV2D, in graph order."""
    from serializer.tosa_serializer import DTypeNames
    from tosa.TosaGraph import TosaGraph

    block = TosaGraph.GetRootAs(tosa, 0).Regions(0).Blocks(0)
    tensors = {block.Tensors(i).Name().decode(): block.Tensors(i) for i in range(block.TensorsLength())}
    found = []
    for op in (block.Operators(i) for i in range(block.OperatorsLength())):
        if op.Op() in (Op.CONV2D, Op.DEPTHWISE_CONV2D):
            w, zp = tensors[op.Inputs(1).decode()], tensors[op.Inputs(4).decode()]
            values = w.DataAsNumpy().view(np.int8) if DTypeNames[w.Type()] == "INT8" else None
            found.append((DTypeNames[w.Type()], values, DTypeNames[zp.Type()]))
    return found


def test_a8w4_config_is_executorchs():
    """ExecuTorch's semantics: per-channel symmetric weights in -7..7, int8 activations, QAT by default."""
    from torchao.quantization.pt2e.fake_quantize import FakeQuantize

    config = get_symmetric_a8w4_quantization_config()
    w = config.weight
    assert (w.quant_min, w.quant_max, w.dtype, w.qscheme) == (-7, 7, torch.int8, torch.per_channel_symmetric)
    assert config.input_activation.dtype == torch.int8
    assert issubclass(w.observer_or_fake_quant_ctr.p.func, FakeQuantize)
    assert not issubclass(get_symmetric_a8w4_quantization_config(is_qat=False).weight.observer_or_fake_quant_ctr.p.func,
                          FakeQuantize)


@pytest.mark.parametrize("target,storage", [("TOSA-1.0+INT+int4", "INT4"), ("TOSA-1.0+INT", "INT8")],
                         ids=["int4", "int"])
def test_a8w4_weights_are_int4_where_the_target_has_the_extension_int(target, storage):
    """With TOSA's int4 extension the convolution and linear weights (and their zero point) are INT4; without it
    INT8 holding -7..7. Either way the reference model's outputs equal the fake-quantized model's exactly."""
    model, inputs = _convs()
    compiled = _a8w4(target, model, inputs)
    [delegate] = [m for m in compiled.edge.program.graph_module.children() if hasattr(m, "tosa")]
    found = _weights(delegate.tosa)
    assert len(found) == 3 and {(w, zp) for w, _, zp in found} == {(storage, storage)}
    if storage == "INT8":
        assert all(int(np.abs(v).max()) <= 7 for _, v, _ in found)
    assert torch.equal(run_edge(compiled.edge, *inputs)[0], evaluate_exact(compiled.quantized, *inputs)[0])


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"], ids=["u55", "u85"])
def test_a8w4_runs_on_the_npu_with_half_the_weight_bytes_u55_u85(target):
    """Vela 5.2 takes the INT4 weights: everything on the NPU, the encoded weights at most 55% of int8's (4-bit
    values, fewer distinct ones), and the command stream simulated bit for bit against its TOSA."""
    model, inputs = _convs()
    a8w4 = _a8w4(target, model, inputs)
    int8 = compile(model, inputs, target, quantize=True)
    [d4], [d8] = a8w4.edge.delegates, int8.edge.delegates
    [(tosa, payload)] = ethosu_delegates(a8w4)
    assert d4.report.cpu_ops == 0 and {w for w, _, _ in _weights(tosa)} == {"INT4"}
    assert d4.report.weights_encoded_bytes <= 0.55 * d8.report.weights_encoded_bytes, \
        (d4.report.weights_encoded_bytes, d8.report.weights_encoded_bytes)
    assert_npu_bit_exact(tosa, payload)


# ------------------------------------------------------------------ 2:4 pruning and clustering


def _sparsity_formats(payload) -> list[str]:
    """The weight sparsity of each NPU operation that sets it, from the command stream."""
    from tosakit.runtime.ethosu.commands import decode, disassemble

    return [line.split()[-1] for line in disassemble(decode(payload.cmd_data)) if "WEIGHT_SPARSITY" in line]


def _conv_weights(compiled) -> list[np.ndarray]:
    from tosakit.program import LoweredBackendModule

    [module] = [m for m in compiled.edge.program.graph_module.children() if isinstance(m, LoweredBackendModule)]
    return [v for _, v, _ in _weights(module.tosa)]


def test_prune_2_4_keeps_two_of_every_four_and_its_zeros_while_fine_tuning():
    """By magnitude, in every 4 consecutive input channels; the fine-tuning hook trains the model and the pruned
    weights stay 0; the TOSA's int8 weights have the structure."""
    from tosakit.quantize.transforms import prune_2_4

    model, inputs = _convs()
    first = model[0].weight.detach().clone()

    def fine_tune(m):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
        m(*inputs).square().sum().backward()
        optimizer.step()

    prune_2_4(model, fine_tune=fine_tune)
    groups = model[0].weight.detach().reshape(32, 4, 4, 9)
    assert int((groups == 0).sum(2).min()) == 2
    kept = model[0].parametrizations.weight[0].mask.reshape(32, 4, 4, 9).bool()
    assert torch.equal(kept, first.reshape(32, 4, 4, 9).abs() >= first.reshape(32, 4, 4, 9).abs().sort(2)
                       .values[:, :, 2:3])  # the two largest of each four
    compiled = compile(model.eval(), inputs, "TOSA-1.0+INT", quantize=True)
    for w in _conv_weights(compiled)[:2]:  # OHWI, flat: input channels last, 16 and 32 of them
        assert int((w.reshape(-1, 4) == 0).sum(-1).min()) >= 2


def test_2_4_sparse_weights_run_in_velas_sparse_format_u85():
    """Vela 5.2 picks its 2:4 sparse weight format for the pruned convolutions (read from the command stream), the
    cycles drop below the dense model's, and the stream simulates bit for bit."""
    from tosakit.quantize.transforms import prune_2_4

    model, inputs = _convs()
    dense = compile(model, inputs, "ethos-u85-256", quantize=True)
    sparse = compile(prune_2_4(copy_of(model)), inputs, "ethos-u85-256", quantize=True)
    [(tosa, payload)] = ethosu_delegates(sparse)
    assert "WEIGHT_SPARSITY_SPARSE_2_4" in _sparsity_formats(payload)
    assert set(_sparsity_formats(ethosu_delegates(dense)[0][1])) == {"WEIGHT_SPARSITY_NONE"}
    assert sparse.edge.delegates[0].report.total_cycles < dense.edge.delegates[0].report.total_cycles
    assert_npu_bit_exact(tosa, payload)


def test_2_4_sparse_weights_compress_u55():
    """Ethos-U55 has no sparse format: there the pruned weights are zeros in the TOSA (2 of every 4 consecutive
    input channels of each convolution) that Vela's weight encoder stores in fewer bytes, every operation's
    sparsity left NONE; the stream simulates bit for bit."""
    from tosakit.quantize.transforms import prune_2_4

    model, inputs = _convs()
    dense = compile(model, inputs, "ethos-u55-128", quantize=True)
    sparse = compile(prune_2_4(copy_of(model)), inputs, "ethos-u55-128", quantize=True)
    [(tosa, payload)] = ethosu_delegates(sparse)
    for _, w, _ in _weights(tosa)[:2]:  # OHWI: input channels last
        groups = w.reshape(32, 3, 3, -1, 4)
        assert ((groups == 0).sum(-1) >= 2).all()
    assert "WEIGHT_SPARSITY_SPARSE_2_4" not in _sparsity_formats(payload)
    assert sparse.edge.delegates[0].report.weights_encoded_bytes < \
        0.8 * dense.edge.delegates[0].report.weights_encoded_bytes
    assert_npu_bit_exact(tosa, payload)


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"], ids=["u55", "u85"])
def test_clustered_weights_are_a_few_shared_integers_u55_u85(target):
    """Clustered to 8 levels per output channel's scale, every convolution's int8 weights hold at most 8
    distinct integers across the tensor, Vela encodes them in fewer bytes than the dense model's, and the stream
    simulates bit for bit."""
    from tosakit.quantize.transforms import cluster_weights

    model, inputs = _convs()
    dense = compile(model, inputs, target, quantize=True)
    clustered = compile(cluster_weights(copy_of(model), 8), inputs, target, quantize=True)
    [(tosa, payload)] = ethosu_delegates(clustered)
    assert all(len(np.unique(w)) <= 8 for _, w, _ in _weights(tosa))
    assert clustered.edge.delegates[0].report.weights_encoded_bytes < \
        0.8 * dense.edge.delegates[0].report.weights_encoded_bytes
    assert_npu_bit_exact(tosa, payload)


def test_clustering_trains_its_shared_levels_and_selects_modules():
    from tosakit.errors import TosakitError
    from tosakit.quantize.transforms import cluster_weights

    model, inputs = _convs()
    cluster_weights(model, 4, modules=["2"])  # the second convolution only
    assert not hasattr(model[0], "parametrizations") and hasattr(model[2], "parametrizations")
    model(*inputs).sum().backward()
    assert model[2].parametrizations.weight[0].levels.grad is not None
    assert all(len(torch.unique(row)) <= 4 for row in model[2].weight.detach().reshape(32, -1))
    with pytest.raises(TosakitError, match=r"no convolution or linear layer among \['nope'\]"):
        cluster_weights(model, 4, modules=["nope"])


def copy_of(model):
    import copy

    return copy.deepcopy(model)


# ------------------------------------------------------------------ the sweep


def test_sweep_measures_each_scheme_and_its_front(tmp_path):
    """digits on ethos-u55-128: each scheme's accuracy (float, fake-quantized, program), Vela's figures and
    per-operation cycles; clustering to 8 levels encodes fewer weight bytes than int8; the Pareto front holds the
    schemes no other beats on both; report.html carries the plots and the per-operation table."""
    from tosakit.report import write_sweep_html
    from tosakit.sweep import pareto, sweep, table

    rows = sweep("digits", "ethos-u55-128", ["int8", "int8+cluster8"], limit=40, progress=False)
    int8, clustered = rows
    assert int8.accuracy.float_accuracy == clustered.accuracy.float_accuracy
    assert clustered.weights_encoded_bytes < int8.weights_encoded_bytes and int8.cycles > 0
    assert {op.name for op in int8.per_op} and sum(op.cycles for op in int8.per_op) <= int8.cycles
    front = pareto(rows, "weights_encoded_bytes")
    assert "int8+cluster8" in front and ("int8" in front) == (int8.score > clustered.score)
    assert "int8+cluster8" in table(rows)
    fronts = {cost: pareto(rows, cost) for cost in ("cycles", "weights_encoded_bytes")}
    write_sweep_html(tmp_path / "report.html", "digits", rows, fronts)
    page = (tmp_path / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 1 and int8.per_op[0].name in page


def test_sweep_in_worker_processes_and_on_ray_gives_the_same_rows(monkeypatch):
    """Two schemes compiled in two worker processes, and as tasks of a local Ray cluster (started and shut down by
    the sweep): the figures equal the ones compiled here."""
    import ray

    from tosakit.sweep import sweep

    schemes = ["int8", "a8w4"]
    here = sweep("digits", "ethos-u55-128", schemes, jobs=1, limit=20, progress=False)
    pool = sweep("digits", "ethos-u55-128", schemes, jobs=2, limit=20, progress=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    on_ray = sweep("digits", "ethos-u55-128", schemes, limit=20, progress=False, ray_address="")
    assert not ray.is_initialized()
    figures = lambda r: (r.scheme, r.cycles, r.weights_encoded_bytes, r.accuracy.program_accuracy)  # noqa: E731
    assert list(map(figures, pool)) == list(map(figures, here)) == list(map(figures, on_ray))


@pytest.mark.parametrize("target", ["ethos-u55-128", "ethos-u85-256"], ids=["u55", "u85"])
def test_a8w4_on_pointwise_layers_keeps_the_first_and_depthwise_convolutions_int8_u55_u85(target):
    """'a8w4@pointwise': INT4 weights on the 1x1 convolutions and the linear layer, INT8 on the first and the
    depthwise convolution; on ethos-u55-128 the encoded weights between int8's and a8w4's; simulated bit for bit."""
    from tosakit.quantize.config import get_symmetric_quantization_config
    from tosakit.sweep import unselected

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU6(),
                                torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.ReLU6(),
                                torch.nn.Conv2d(16, 32, 1), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                                torch.nn.Linear(32, 10)).eval()
    inputs = (torch.randn(1, 3, 8, 8),)
    assert unselected(model, "a8w4@pointwise") == ("0", "2") and unselected(model, "a8w4") == ()
    int8 = get_symmetric_quantization_config()
    mixed = compile(model, inputs, target, quantize=True, config=get_symmetric_a8w4_quantization_config(is_qat=False),
                    module_configs={name: int8 for name in unselected(model, "a8w4@pointwise")})
    [(tosa, payload)] = ethosu_delegates(mixed)
    assert [w for w, _, _ in _weights(tosa)] == ["INT8", "INT8", "INT4", "INT4"]
    if target == "ethos-u55-128":  # (Vela's U85 encoder packs this small model's int4 weights no smaller)
        sizes = [c.edge.delegates[0].report.weights_encoded_bytes
                 for c in (_a8w4(target, model, inputs), mixed, compile(model, inputs, target, quantize=True))]
        assert sizes == sorted(sizes) and len(set(sizes)) == 3, sizes
    assert_npu_bit_exact(tosa, payload)


@pytest.mark.parametrize("scheme,message", [("int9", "unknown quantization 'int9'"),
                                            ("int8+3:4", "unknown weight transform(s) 3:4"),
                                            ("a8w4@depthwise", "unknown layer kind 'depthwise' after '@'")])
def test_sweep_refuses_unknown_schemes(scheme, message, capsys):
    from tosakit.cli import main

    assert main(["sweep", "-m", "digits", "--schemes", scheme]) == 2
    assert message in capsys.readouterr().err


def test_sweep_help_names_the_default_schemes(capsys):
    """The CLI's help spells out sweep.DEFAULT_SCHEMES (kept as text so `tosakit --help` imports no torch)."""
    from tosakit.cli import main
    from tosakit.sweep import DEFAULT_SCHEMES

    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    assert ", ".join(DEFAULT_SCHEMES) in " ".join(capsys.readouterr().out.split())


def test_sweep_on_ray_without_ray_installed_says_what_to_install(monkeypatch, capsys):
    import sys

    from tosakit.cli import main

    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as it does where Ray is not installed
    assert main(["sweep", "-m", "digits", "--schemes", "int8", "--ray"]) == 2
    assert "needs Ray installed" in (err := capsys.readouterr().err) and "tosakit[cluster]" in err


def test_sweep_counts_the_operations_in_velas_sparse_format_u85():
    from tosakit.sweep import run_scheme

    dense, sparse = (run_scheme("mv2", "ethos-u85-256", s) for s in ("int8", "int8+2:4"))
    assert dense.sparse_ops == 0 < sparse.sparse_ops
    assert sparse.cycles <= 0.85 * dense.cycles, (sparse.cycles, dense.cycles)


def test_layer_choice_keeps_the_most_sensitive_layers_in_int8_within_the_budget(capsys):
    """a8w4 on digits with a 1-point budget: each layer's sensitivity measured alone, the most sensitive kept in
    int8 first, and the mix's program within the budget of float; the CLI prints the choice and the row."""
    from tosakit.cli import main
    from tosakit.sweep import choose_layers

    choice = choose_layers("digits", "ethos-u55-128", "a8w4", budget=1.0, limit=100)
    assert set(choice.sensitivity) == {"features.0", "features.3", "classifier"}
    assert list(choice.kept) == sorted(choice.kept, key=lambda n: -choice.sensitivity[n])[:len(choice.kept)]
    assert choice.kept and choice.row.accuracy.loss <= 1.0
    everywhere = max(choice.sensitivity.values())
    assert everywhere > 1.0  # a8w4 somewhere costs more than the budget: the choice had work to do
    from tosakit.zoo import MODELS

    own = choose_layers(MODELS["digits"].factory()[0], "ethos-u55-128", "a8w4", limit=100,
                        data=MODELS["digits"].data())  # a module of one's own and its data: the same choice
    assert own.kept == choice.kept and own.row.cycles == choice.row.cycles
    assert main(["sweep", "-m", "digits", "--schemes", "int8", "--limit", "100", "--choose", "a8w4"]) == 0
    out = capsys.readouterr().out
    assert "kept in int8 for a 1-point budget:" in out and f"a8w4~{len(choice.kept)}int8" in out


def test_a8w4_quantization_aware_training_lowers_int4_u85():
    """QAT, ExecuTorch's default for a8w4: prepare_qat_pt2e with the quantizer, a few training steps, convert_pt2e;
    the trained graph lowers whole with INT4 weights and its program equals the fake-quantized model exactly."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e

    from tosakit import EthosUCompileSpec, EthosUQuantizer

    model, (x,) = _convs()
    labels = torch.arange(10)[: x.shape[0]]
    spec = EthosUCompileSpec("ethos-u85-256")
    quantizer = EthosUQuantizer(spec).set_global(get_symmetric_a8w4_quantization_config())
    prepared = prepare_qat_pt2e(torch.export.export(model.train(), (x,)).module(), quantizer)
    optimizer = torch.optim.SGD(prepared.parameters(), lr=0.01)
    for _ in range(3):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(prepared(x), labels).backward()
        optimizer.step()
    quantized = convert_pt2e(prepared)
    compiled = compile(torch.export.export(quantized, (x,)), (x,), spec)
    [(tosa, _)] = ethosu_delegates(compiled)
    assert {w for w, _, _ in _weights(tosa)} == {"INT4"} and compiled.edge.delegates[0].report.cpu_ops == 0
    assert torch.equal(run_edge(compiled.edge, x)[0], evaluate_exact(quantized, x)[0])
