"""The field's own model definitions by name, random weights and no downloads: ``torchvision:NAME``
(``torchvision.models``), ``timm:NAME`` and ``hf:ORG/NAME`` (a Hugging Face transformers architecture built from a
configuration tosakit knows). Their packages are the ``models`` extra (``pip install tosakit[models]``).

torchvision on PyPI is a CUDA build: its compiled operators (nms, roi_align, ...) do not load beside torch's CPU
wheel, and importing it fails where it registers their fake kernels. The model definitions are pure Python and need
none of them, so ``import_torchvision`` imports torchvision with those two registration modules left out; a model
that calls a torchvision operator (detection's nms) fails when it runs, naming the operator."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import TosakitError, did_you_mean
from . import hf_tiny

# torchvision modules that register kernels for its compiled operators: left out when those are absent.
_TORCHVISION_REGISTRATIONS = ("torchvision._meta_registrations", "torchvision._autograd_registrations")
_INSTALL = "install the models extra: pip install 'tosakit[models]' (torchvision, timm, transformers, pinned)"


def _missing(package: str) -> TosakitError:
    return TosakitError(f"{package} is not installed", _INSTALL)


def import_torchvision() -> types.ModuleType:
    """torchvision, imported beside torch's CPU wheel (see the module's docstring)."""
    if "torchvision" in sys.modules:
        return sys.modules["torchvision"]
    try:
        return importlib.import_module("torchvision")
    except ModuleNotFoundError:
        raise _missing("torchvision") from None
    except RuntimeError as exc:
        if "torchvision::" not in str(exc):
            raise
    for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
        del sys.modules[name]  # the half-imported package
    for name in _TORCHVISION_REGISTRATIONS:
        sys.modules[name] = types.ModuleType(name, "left out: torchvision's compiled operators are not loaded")
    return importlib.import_module("torchvision")


def import_field(package: str) -> types.ModuleType:
    """timm or transformers (both import torchvision when it is installed: through ``import_torchvision``)."""
    if importlib.util.find_spec("torchvision"):
        import_torchvision()
    try:
        return importlib.import_module(package)
    except ModuleNotFoundError:
        raise _missing(package) from None


VIDEO_FRAMES = 16  # torchvision's video classifiers' clip length (each takes at most 16 as its minimum)


def _image(size: int = 224, batch: int = 1) -> tuple[torch.Tensor]:
    return (torch.randn(batch, 3, size, size),)


def _torchvision(name: str) -> tuple[torch.nn.Module, tuple]:
    models = import_torchvision().models
    known = models.list_models()
    if name not in known:
        raise TosakitError(f"torchvision has no model {name!r}", did_you_mean(name, known))
    kwargs = {"aux_logits": False, "init_weights": True} if name in ("inception_v3", "googlenet") else {}
    segmentation = name in models.list_models(models.segmentation)
    detection = name in models.list_models(models.detection)
    if name in models.list_models(models.video):  # a clip: 16 frames at its weights' crop
        crop = models.get_model_weights(name).DEFAULT.transforms().crop_size
        return models.get_model(name, weights=None), (torch.randn(1, 3, VIDEO_FRAMES, *crop),)
    if name in models.list_models(models.optical_flow):  # the flow between two frames
        return models.get_model(name, weights=None), _image() + _image()
    if segmentation:
        kwargs = {"weights_backbone": None, "aux_loss": False}
    if detection:
        kwargs = {"weights_backbone": None}
    model = models.get_model(name, weights=None, **kwargs)
    size = 299 if name == "inception_v3" else 224
    if segmentation:
        model = _OutDict(model)
    if detection:
        if not hasattr(model, "head"):
            raise TosakitError(f"torchvision:{name} crops regions (roi_align) between its stages: it does not lower",
                               "a dense-head detector (ssdlite320_mobilenet_v3_large, ssd300_vgg16, retinanet_*, "
                               "fcos_*) "
                               "does: its backbone and head are compiled, boxes are decoded on the CPU")
        size = (model.transform.fixed_size or model.transform.min_size)[0]  # the size its transform resizes to
        model = _DenseHead(model)
    return model, _image(size)


class _DenseHead(torch.nn.Module):
    """A dense-head torchvision detector's backbone and head: box regressions and class logits for every anchor (what
    an NPU computes; anchors, box decoding and non-maximum suppression stay on the CPU, as in deployment)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.backbone, self.head = model.backbone, model.head

    def forward(self, x):
        features = self.backbone(x)
        out = self.head(list(features.values()) if isinstance(features, dict) else [features])
        return out["bbox_regression"], out["cls_logits"]


class _OutDict(torch.nn.Module):
    """A torchvision segmentation model's ``out`` tensor (it returns a dict)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"]


def _timm(name: str) -> tuple[torch.nn.Module, tuple]:
    timm = import_field("timm")
    known = timm.list_models()
    if name not in known:
        raise TosakitError(f"timm has no model {name!r}", did_you_mean(name, known))
    model = timm.create_model(name, pretrained=False)
    _, height, width = model.pretrained_cfg.get("input_size", (3, 224, 224))
    return model, (torch.randn(1, 3, height, width),)


@dataclass(frozen=True)
class HfModel:
    """A Hugging Face architecture tosakit builds without the hub: its config class, model class and config."""

    config_class: str
    model_class: str
    config: dict
    inputs: Callable[[dict], tuple]


def _tokens(config: dict, length: int = 32) -> tuple[torch.Tensor]:
    """A prompt of ``length`` token ids, int32 (TOSA has no int64; the embedding gathers on the NPU)."""
    generator = torch.Generator().manual_seed(0)
    return (torch.randint(0, config["vocab_size"], (1, length), generator=generator, dtype=torch.int32),)


# Published configurations (each model's config.json on the hub), by repository id.
HF_MODELS = {
    "HuggingFaceTB/SmolLM2-135M": HfModel("LlamaConfig", "LlamaForCausalLM", dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, hidden_act="silu", max_position_embeddings=8192, rms_norm_eps=1e-5,
        rope_theta=100000.0, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0), _tokens),
}


class _Logits(torch.nn.Module):
    """A transformers model's logits alone (it returns a ModelOutput), without its KV cache."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


def _hf(name: str) -> tuple[torch.nn.Module, tuple]:
    tiny = [f"tiny/{n}" for n in hf_tiny.TINY]
    if name not in HF_MODELS and name not in tiny:
        raise TosakitError(f"no configuration of Hugging Face model {name!r} is built in (tosakit downloads nothing)",
                           f"{did_you_mean(name, [*HF_MODELS, *tiny])}; or build it in a file and pass "
                           "path/to/model.py:factory")
    transformers = import_field("transformers")
    if name in tiny:
        return hf_tiny.build(transformers, name.partition("/")[2])
    spec = HF_MODELS[name]
    config = getattr(transformers, spec.config_class)(**spec.config)
    model = getattr(transformers, spec.model_class)(config)
    return _Logits(model), spec.inputs(spec.config)


_DECODER_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                   "num_key_value_heads", "rope_theta", "rms_norm_eps")


def hf_decoder(spec: str, layers: int | None = None, max_positions: int = 64, seed: int = 0,
               cache_in_place: bool = True):
    """``hf:ORG/NAME`` (a Llama-architecture configuration tosakit knows) as a ``zoo.decoder.Decoder`` with a KV
    cache of ``max_positions`` (its own buffers, updated in place; with ``cache_in_place=False`` inputs and
    outputs), ``layers`` of its layers when given; seeded random weights."""
    from .decoder import Decoder, DecoderConfig

    source, _, name = spec.partition(":")
    llama = [n for n, m in HF_MODELS.items() if m.config_class == "LlamaConfig"]
    if source != "hf" or name not in llama:
        raise TosakitError(f"{spec!r} is not a decoder tosakit builds with a KV cache",
                           f"give one of: {', '.join('hf:' + n for n in llama)}")
    config = {k: HF_MODELS[name].config[k] for k in _DECODER_FIELDS}
    if layers is not None:
        if not 1 <= layers <= config["num_hidden_layers"]:
            raise TosakitError(f"--layers {layers}: {name} has {config['num_hidden_layers']} layers",
                               f"give 1..{config['num_hidden_layers']}")
        config["num_hidden_layers"] = layers
    torch.manual_seed(seed)
    return Decoder(DecoderConfig(**config, max_positions=max_positions), cache_in_place).eval()


SOURCES: dict[str, Callable[[str], tuple[torch.nn.Module, tuple]]] = {
    "torchvision": _torchvision, "timm": _timm, "hf": _hf}


def load_field_model(spec: str) -> tuple[torch.nn.Module, tuple]:
    """``torchvision:mobilenet_v3_small`` and the like -> (module, example inputs), weights seeded."""
    source, _, name = spec.partition(":")
    torch.manual_seed(0)
    model, inputs = SOURCES[source](name)
    return model.eval(), inputs
