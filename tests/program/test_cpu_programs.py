"""Every op of the lowering table as a CPU-only program (no partitioner), float and quantized: written,
loaded and executed by the ExecuTorch 1.5.1 runtime, its outputs matching PyTorch (float: allclose;
quantized: the fake-quantized model within one output step, layer by layer where the program rounds more
than once: see ``ProgramCheck.cpu_only``) and `tosakit run`'s."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from support.op_cases import Fn, seed_inputs
from support.op_tables import INT8_TABLES
from support.op_tables.layers import TOKENS, TokenEmbedding

pytestmark = pytest.mark.numerics



def _fn(fn, *shapes):
    return Fn(fn).eval(), seed_inputs(*shapes)


def _conv_pool_channels_last():
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(8, 4, 1))
    return module.eval(), (seed_inputs((1, 3, 8, 8))[0].to(memory_format=torch.channels_last),)


def _embedding():
    torch.manual_seed(0)
    return TokenEmbedding().eval(), TOKENS


# Ops tested outside the four op tables (their own test functions there), as (builder, quantizable).
EXTRA = {
    "embedding": (_embedding, True),
    "argmax": (lambda: (Fn(lambda x: x.argmax(1)).eval(), seed_inputs((2, 5, 3))), True),
    "argmax_int32": (lambda: (Fn(lambda x: x.argmax(-1).to(torch.int32)).eval(), seed_inputs((2, 3, 4))), True),
    "hardswish": (lambda: (nn.Hardswish().eval(), seed_inputs((1, 4, 6))), True),
    "hardsigmoid": (lambda: (nn.Hardsigmoid().eval(), seed_inputs((1, 4, 6))), True),
    "chunk_attention": (lambda: (Fn(lambda x: torch.softmax(x.chunk(2, -1)[0] @ x.chunk(2, -1)[1].transpose(1, 2),
                                                            -1)).eval(), seed_inputs((1, 6, 8))), True),
    "max_pool2d_indices": (lambda: (nn.MaxPool2d(2, return_indices=True).eval(), seed_inputs((1, 3, 6, 6))), False),
    "conv_pool_channels_last": (_conv_pool_channels_last, True),
    "detach": (lambda: _fn(lambda x: x.detach() * 2, (2, 5)), True),
    "erf": (lambda: _fn(torch.erf, (2, 5)), True),
    "eq_tensor": (lambda: _fn(lambda x, y: x.round() == y.round(), (2, 5), (2, 5)), True),
    "ge_tensor": (lambda: _fn(lambda x, y: x >= y, (2, 5), (2, 5)), True),
    "ne_scalar": (lambda: _fn(lambda x: x.round() != 0, (2, 5)), True),
    "logical_and": (lambda: _fn(lambda x, y: torch.logical_and(x > 0, y > 0), (2, 5), (2, 5)), True),
    "logical_xor": (lambda: _fn(lambda x, y: torch.logical_xor(x > 0, y > 0), (2, 5), (2, 5)), True),
    "min_all": (lambda: _fn(lambda x: x.min(), (2, 5)), True),
    "reflection_pad1d": (lambda: _fn(lambda x: nn.functional.pad(x, (2, 1), mode="reflect"), (1, 3, 6)), True),
    "reflection_pad3d": (lambda: _fn(lambda x: nn.functional.pad(x, (1, 1, 1, 0, 0, 1), mode="reflect"),
                                     (1, 2, 3, 4, 4)), True),
    "replication_pad1d": (lambda: _fn(lambda x: nn.functional.pad(x, (2, 1), mode="replicate"), (1, 3, 6)), True),
    "replication_pad3d": (lambda: _fn(lambda x: nn.functional.pad(x, (1, 1, 1, 0, 0, 1), mode="replicate"),
                                      (1, 2, 3, 4, 4)), True),
}


def _cases():
    """(id, builder, flavours) for every case of every op table, and the extras."""
    cases = []
    for table in INT8_TABLES:
        for name, flavours in table.flavours.items():
            cases.append((f"{table.name}.{name}", lambda t=table, n=name: t.build(n), flavours))
    for name, (build, quantizable) in EXTRA.items():
        cases.append((f"extra.{name}", build, ("fp", "int") if quantizable else ("fp",)))
    return cases


CASES = _cases()


def _params():
    return [pytest.param(build, flavour == "int", id=f"{case_id}_{flavour}") for flavour in ("fp", "int")
            for case_id, build, flavours in CASES if flavour in flavours]


@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("build, quantize", _params())
def test_cpu_program(build, quantize, program_check):
    module, inputs = build()
    program_check.cpu_only(module, inputs, quantize)


@pytest.mark.oracle
def test_conv_transpose2d_the_npu_refuses_runs_on_the_cpu(harness, program_check):
    """A transposed convolution no Ethos-U55 form takes (dilation 2, stride 3) stays on the CPU with the reason,
    and the program the partitioner leaves runs in ExecuTorch's runtime, within one step of the quantized model."""
    torch.manual_seed(0)
    module, inputs = nn.ConvTranspose2d(4, 4, 3, 3, 1, 1, dilation=2).eval(), seed_inputs((1, 4, 5, 5))
    compiled = harness.compile(module, inputs, "ethos-u55-128", quantize=True)
    [left] = harness.cpu_compute(compiled)
    assert left.target == "aten.convolution.default" and "dilation [2, 2]" in left.reason
    assert not compiled.edge.delegates
    program_check.program(compiled, inputs, module)


def test_sweep_covers_the_lowering_table():
    """Each ATen op the lowering table lowers is in some swept case's captured graph (but for the forms
    that capture itself rewrites, such as reshape -> view)."""
    from tosakit.capture import PRESERVED_OPS, capture, decomposition_table, export
    from tosakit.capture.core_aten import _decomposed
    from tosakit.lower import RULES

    seen = set()
    for _, build, _ in CASES:
        module, inputs = build()
        seen |= {n.target for n in capture(export(module, inputs)).graph.nodes if n.op == "call_function"}
    table = decomposition_table()
    missing = sorted(str(t) for t in RULES if t not in seen and "quantized_decomposed" not in str(t)
                     and not _decomposed(t, table, PRESERVED_OPS))
    assert not missing, f"lowered ops no CPU-program case exercises: {missing}"


def _models():
    from tosakit.zoo import MODELS

    return list(MODELS)


@pytest.mark.slow
@pytest.mark.oracle
@pytest.mark.parametrize("quantize", [False, True], ids=["fp", "int"])
@pytest.mark.parametrize("name", _models())
def test_builtin_model_cpu_program(name, quantize, program_check):
    """Each built-in model as a CPU-only program, float and quantized, run by ExecuTorch and tosakit; a
    quantized one is compared with the fake-quantized model layer by layer in ExecuTorch (within one
    step) and as a whole on the host (`tosakit run` within one step). ExecuTorch runs it from a .bpte tosakit
    wrote (its bundled inputs, its verify of tosakit's outputs, its serializer's reading)."""
    from tosakit.zoo import MODELS

    module, inputs = MODELS[name].factory()
    compiled = program_check.cpu_only(module.eval(), inputs, quantize, whole_in_executorch=not quantize, bundled=True)
    if quantize:
        from tosakit.quantize.qdq import is_quantize

        quantized = any(is_quantize(n) for n in compiled.edge.program.graph.nodes)  # not `add`: int32 only
        assert (program_check.layers(compiled, inputs) > 0) == quantized


@pytest.mark.oracle
def test_kernel_list_is_the_runtimes(et_oracle):
    """program/kernels.txt, which emission and the host runtime trust, names only kernels ExecuTorch
    1.5.1 registers, and all of its ATen, quantized and dim-order ones."""
    from tosakit.program.kernels import runtime_kernels

    namespaces = ("aten", "quantized_decomposed", "dim_order_ops")
    registered = {k for k in et_oracle.kernels() if k.split("::")[0] in namespaces}
    ours = {k for k in runtime_kernels() if k.split("::")[0] in namespaces}  # cortex_m: test_cortex_m_ops
    assert ours == registered, (sorted(ours - registered), sorted(registered - ours))


def test_kernel_schemas_are_the_runtimes(et_oracle):
    """The schema kernels.txt gives each kernel, which the host runtime checks every KernelCall against,
    is the one ExecuTorch 1.5.1 registers it with, and reads back argument by argument."""
    from tosakit.program.kernels import kernel_schemas

    theirs = et_oracle.kernel_schemas()
    ours = {k: v for k, v in kernel_schemas().items() if not k.startswith("cortex_m::")}  # test_cortex_m_ops
    text = (Path(__file__).resolve().parents[2] / "src/tosakit/program/kernels.txt").read_text()
    lines = {ln.split("(")[0]: ln for ln in text.splitlines() if ln and not ln.startswith("#")}
    assert {k: lines[k] for k in ours} == {k: theirs[k] for k in ours}
    split = ours["aten::split_with_sizes_copy.out"]
    assert [(a.name, a.kinds(), a.is_out) for a in split.args] == [
        ("self", ("Tensor",), False), ("split_sizes", ("IntList",), False), ("dim", ("Int",), False),
        ("out", ("TensorList",), True)]
    assert split.return_kinds == ("TensorList",) and ours["aten::add.out"].return_kinds == ("Tensor",)
    assert ours["aten::index.Tensor_out"].args[1].kinds() == ("OptionalTensorList",)
    assert ours["aten::sym_size.int"].return_kinds == ("Int",)
