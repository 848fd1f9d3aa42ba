"""The field's own model definitions by name (``torchvision:``, ``timm:``, ``hf:``): imported beside torch's CPU
wheel, built with seeded random weights, compiled and delegated like the zoo's."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
import torch

from tosakit.capture import export
from tosakit.errors import TosakitError
from tosakit.flow import partitioner_for, quantize_model
from tosakit.program import to_edge_transform_and_lower
from tosakit.specs import compile_spec_for_target
from tosakit.zoo import field, load_model

pytestmark = pytest.mark.skipif(not all(importlib.util.find_spec(p) for p in ("torchvision", "timm", "transformers")),
                                reason="the models extra is not installed (make test installs it)")


def test_torchvision_imports_beside_the_cpu_wheel():
    """torchvision's compiled operators are absent beside torch's CPU wheel; its models still import and run."""
    tv = field.import_torchvision()
    compiled = hasattr(torch.ops.torchvision, "nms") and torch.ops.torchvision.nms.default is not None
    if not compiled:
        assert all(sys.modules[name].__doc__.startswith("left out") for name in field._TORCHVISION_REGISTRATIONS)
    model = tv.models.mobilenet_v3_small(weights=None).eval()
    assert model(torch.randn(1, 3, 224, 224)).shape == (1, 1000)


def test_field_models_load_by_name():
    name, model, inputs = load_model("torchvision:mobilenet_v3_small")
    assert name == "mobilenet_v3_small" and not model.training and inputs[0].shape == (1, 3, 224, 224)
    first = next(model.parameters()).detach().clone()
    assert torch.equal(next(load_model("torchvision:mobilenet_v3_small")[1].parameters()), first)  # seeded
    name, model, inputs = load_model("timm:deit_tiny_patch16_224")
    assert name == "deit_tiny_patch16_224" and model(*inputs).shape == (1, 1000)
    assert load_model("torchvision:inception_v3")[2][0].shape == (1, 3, 299, 299)
    assert load_model("torchvision:mobilenet_v3_small", [(1, 3, 160, 160)])[2][0].shape == (1, 3, 160, 160)  # sweep


def test_hf_decoder_builds_from_its_published_config():
    """SmolLM2-135M's architecture with random weights, no download: its logits for a 32-token prompt."""
    name, model, (tokens,) = load_model("hf:HuggingFaceTB/SmolLM2-135M")
    config = model.model.config
    assert name == "SmolLM2-135M" and (config.num_hidden_layers, config.hidden_size, config.num_key_value_heads) \
        == (30, 576, 3)
    assert 134e6 < sum(p.numel() for p in model.parameters()) < 136e6
    assert tokens.shape == (1, 32) and model(tokens).shape == (1, 32, 49152)


@pytest.mark.parametrize("spec, named", [
    ("torchvision:mobilenet_v3_smal", "mobilenet_v3_small"),
    ("timm:deit_tiny_patch16", "deit_tiny_patch16_224"),
    ("hf:HuggingFaceTB/SmolLM2-136M", "HuggingFaceTB/SmolLM2-135M"),
])
def test_unknown_field_model_names_the_nearest(spec, named):
    with pytest.raises(TosakitError) as err:
        load_model(spec)
    assert named in str(err.value.hint)


def test_unknown_zoo_name_lists_the_field_sources():
    with pytest.raises(TosakitError) as err:
        load_model("mobilenet_v3_smal")
    assert "torchvision:NAME" in err.value.hint and "hf:NAME" in err.value.hint


@pytest.mark.slow
@pytest.mark.parametrize("target", ["ethos-u85-256", "ethos-u55-128"])
def test_torchvision_mobilenet_v3_small_delegates_whole(target):
    """torchvision's MobileNetV3-small (hard-swish, squeeze-excitation, adaptive pooling) runs whole on the NPU."""
    _, model, inputs = load_model("torchvision:mobilenet_v3_small")
    spec = compile_spec_for_target(target)
    edge = to_edge_transform_and_lower(export(quantize_model(model, inputs, spec), inputs),
                                       partitioner=[partitioner_for(spec)])
    cpu = [f"{p.node}: {p.reason}" for p in edge.placements if p.placement == "cpu" and p.compute]
    assert not cpu and len(edge.delegates) == 1 and edge.delegates[0].report.cpu_ops == 0, cpu


def _tiny_llama():
    """SmolLM2's architecture (Llama: RMSNorm, rotary embeddings, grouped-query attention, SiLU MLP, tied
    embeddings) at a test's size: 2 layers, 64 wide, 4 query and 2 key/value heads, 256 tokens."""
    transformers = field.import_field("transformers")
    spec = field.HF_MODELS["HuggingFaceTB/SmolLM2-135M"]
    config = dict(spec.config, vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    return field._Logits(transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))).eval(), field._tokens(config, 16)


@pytest.mark.slow
@pytest.mark.numerics
def test_llama_decoder_runs_whole_on_u85(harness):
    """The prompt pass of a Llama decoder: int32 token ids in, every op on ethos-u85-256 in one delegate (the
    embedding a GATHER, the rotary tables folded to constants, RMSNorm's same-dtype casts gone), each layer
    within one step of the fake-quantized model."""
    model, inputs = _tiny_llama()
    spec = compile_spec_for_target("ethos-u85-256")
    quantized = quantize_model(model, inputs, spec)
    edge = to_edge_transform_and_lower(export(quantized, inputs), partitioner=[partitioner_for(spec)])
    cpu = [f"{p.node}: {p.reason}" for p in edge.placements if p.placement == "cpu" and p.compute]
    assert not cpu and len(edge.delegates) == 1, cpu
    [delegate] = edge.delegates
    assert delegate.report.cpu_ops == 0 and "GATHER" in delegate.tosa_ops
    assert not {"SIN", "COS"} & set(delegate.tosa_ops)  # positions are known: computed once, as constants
    int_edge = to_edge_transform_and_lower(export(quantized, inputs),
                                           partitioner=[partitioner_for(compile_spec_for_target("TOSA-1.0+INT"))])
    assert harness.assert_integer_lowering(int_edge, inputs, quantized) >= 20


def test_token_id_outside_the_vocabulary_is_refused_before_the_reference_model():
    """The reference model ends its process on a GATHER index outside its table; tosakit checks the index inputs
    first and names the input and the range."""
    from tosakit.runtime.tosa_inprocess import index_bounds, run_tosa

    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 2)).eval()
    tokens = torch.tensor([[1, 2, 9]], dtype=torch.int32)
    spec = compile_spec_for_target("TOSA-1.0+INT")
    edge = to_edge_transform_and_lower(export(quantize_model(model, (tokens,), spec), (tokens,)),
                                       partitioner=[partitioner_for(spec)])
    tosa = edge.program.graph_module.lowered_module_0.tosa
    assert index_bounds(tosa) == {0: 10}
    assert run_tosa(tosa, [tokens.numpy()])
    with pytest.raises(TosakitError, match=r"input 0 holds index 10, outside 0\.\.9"):
        run_tosa(tosa, [torch.tensor([[1, 10, 2]], dtype=torch.int32).numpy()])


@pytest.mark.parametrize("name", sorted(field.hf_tiny.TINY))
def test_hf_tiny_architectures_build_and_export(name):
    """Every tiny Hugging Face configuration builds without the hub and exports; text models take int64 ids."""
    _, model, inputs = load_model(f"hf:tiny/{name}")
    if field.hf_tiny.TINY[name][4] is field.hf_tiny.ids:
        assert inputs[0].dtype == torch.int64
    assert isinstance(model(*inputs), torch.Tensor)
    torch.export.export(model, inputs)


def test_dense_head_detector_builds_without_downloads():
    """A dense-head detector compiles its backbone and head (boxes are decoded on the CPU), at its transform's
    size, with no backbone weights fetched; a region-cropping one is refused by name."""
    _, model, (x,) = load_model("torchvision:ssdlite320_mobilenet_v3_large")
    boxes, logits = model(x)
    assert x.shape == (1, 3, 320, 320) and boxes.shape[:2] == logits.shape[:2] and boxes.shape[-1] == 4
    with pytest.raises(TosakitError, match="roi_align"):
        load_model("torchvision:fasterrcnn_mobilenet_v3_large_320_fpn")


@pytest.mark.slow
def test_tiny_qwen2_with_int64_ids_delegates_whole_and_equals_the_fake_quantized_model():
    """Hugging Face's int64 token ids: the GATHER runs on the NPU (one CPU cast at the edge), the first cat of
    its cache drops the empty past, and the program equals the fake-quantized model bit for bit."""
    from tosakit.flow import compile
    from tosakit.runtime import LoadedProgram, evaluate_exact

    _, model, inputs = load_model("hf:tiny/qwen2")
    compiled = compile(model, inputs, "ethos-u85-256", quantize=True)
    cpu = [p.target for p in compiled.edge.placements if p.placement == "cpu" and p.compute]
    assert not cpu and len(compiled.edge.delegates) == 1, cpu
    program = LoadedProgram(compiled.program.buffer, "qwen2.pte", isolate=False)
    ids = torch.randint(0, 1024, (1, 32), generator=torch.Generator().manual_seed(1))
    assert torch.equal(program.run([ids])[0], evaluate_exact(compiled.quantized, ids)[0])


def test_a_user_file_importing_torchvision_and_timm_loads(tmp_path):
    """A model file that imports the field's libraries itself loads in tosakit's venv, as -m torchvision:NAME does
    (PyPI's torchvision is a CUDA build beside torch's CPU wheel)."""
    path = tmp_path / "my_model.py"
    path.write_text("import torch\nimport torchvision\nimport timm\n\n"
                    "def build():\n"
                    "    return torchvision.models.mobilenet_v3_small(weights=None), (torch.randn(1, 3, 224, 224),)\n")
    name, model, (x,) = load_model(f"{path}:build")
    assert model(x).shape == (1, 1000)


TRANSFORMERS_FILE = """import torch
import transformers


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         intermediate_size=64, max_position_embeddings=16)
        self.bert = transformers.BertModel(config)

    def forward(self, ids):
        return self.bert(input_ids=ids).last_hidden_state


def build():
    return Encoder(), (torch.randint(0, 100, (1, 8)),)
"""


def test_a_user_file_importing_transformers_compiles(tmp_path, monkeypatch, capsys):
    """-m file.py:build with a file that imports transformers and builds a BERT from its config: tosakit compile
    delegates it whole to ethos-u85-256 (the int64 ids cast for the delegate on the CPU)."""
    from tosakit.cli import main

    (tmp_path / "my_bert.py").write_text(TRANSFORMERS_FILE)
    monkeypatch.chdir(tmp_path)
    code = main(["compile", "-q", "-m", "my_bert.py:build", "-t", "ethos-u85-256", "--delegate", "--quantize",
                 "-o", "bert.pte"])
    out = capsys.readouterr().out
    assert code == 0 and (tmp_path / "bert.pte").is_file(), out
    delegated, total = map(int, re.search(r"ops: (\d+) of (\d+) compute ops delegated", out).groups())
    assert delegated == total > 0, out


def test_video_and_optical_flow_models_take_their_own_inputs():
    """A video classifier takes a clip (16 frames at its weights' crop), RAFT two frames: they failed to export with
    an image as their input and the hint to make forward() traceable."""
    assert [tuple(x.shape) for x in load_model("torchvision:r3d_18")[2]] == [(1, 3, 16, 112, 112)]
    name, model, inputs = load_model("torchvision:raft_small")
    assert [tuple(x.shape) for x in inputs] == [(1, 3, 224, 224)] * 2
    export(model, inputs)

