"""Built-in example models (``tosakit compile -m NAME``), and loading a user's model from a file."""

from __future__ import annotations

import importlib.util
import inspect
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ..errors import TosakitError, did_you_mean, first_line
from . import (audio, detection, field, mobilenet_v2, mobilenet_v3, recurrent, resnet, segmentation, speech, tiny,
               trained, transformer, tutorial)
from .inputs import example_inputs


@dataclass(frozen=True)
class ZooModel:
    """A named model: a factory returning ``(module, example_inputs)``, a one-line description, and for
    trained models the data they were trained on (train and held-out split)."""

    name: str
    factory: Callable[[], tuple[torch.nn.Module, tuple]]
    description: str
    data: Callable[[], trained.Split] | None = None


MODELS: dict[str, ZooModel] = {
    m.name: m
    for m in (
        ZooModel("add", tutorial.add, "x + x on int32 (the tutorial's AddModule)"),
        ZooModel("add3", tutorial.add3, "(x + y, x + x) on float (two inputs, two outputs)"),
        ZooModel("softmax", tutorial.softmax, "torch.nn.Softmax on a 2x2 float input (the tutorial's SoftmaxModule)"),
        ZooModel("mv2", mobilenet_v2.build, "MobileNetV2 (1.0, 224x224), seeded random weights, calibrated BN"),
        ZooModel("mv3", mobilenet_v3.build, "MobileNetV3-Small (224x224): hardswish, squeeze-and-excitation"),
        ZooModel("resnet18", resnet.build, "ResNet-18 (224x224): residual blocks, max pool"),
        ZooModel("transformer", transformer.build, "2-layer transformer encoder (32 tokens x 64): layer norm, "
                 "attention, GELU"),
        ZooModel("lstm", recurrent.build, "LSTM keyword spotter (16 frames x 40 features, 64 hidden)"),
        ZooModel("crnn", recurrent.crnn, "CRNN text-line recognizer (16x32): convolutions, bidirectional GRU, "
                 "log-softmax"),
        ZooModel("unet", segmentation.build, "small U-Net segmentation (64x64): upsample, skip concatenation"),
        ZooModel("audio1d", audio.build, "1-D conv keyword spotter (40 MFCC x 98 frames): depthwise conv1d"),
        ZooModel("ds_cnn", tiny.ds_cnn, "MLPerf Tiny DS-CNN keyword spotter (49x10 MFCC): depthwise-separable"),
        ZooModel("resnet8", tiny.resnet8, "MLPerf Tiny ResNet-8 (CIFAR-10, 32x32): three residual stacks"),
        ZooModel("mobilenet_v1_025", tiny.mobilenet_v1_025, "MLPerf Tiny MobileNetV1 0.25 (visual wake words, "
                 "96x96)"),
        ZooModel("deep_autoencoder", tiny.deep_autoencoder, "MLPerf Tiny Deep AutoEncoder (640 features): dense, "
                 "batch norm"),
        ZooModel("wav2letter", speech.wav2letter, "Wav2Letter (torchaudio's layout) on a 128-sample power spectrum: "
                 "1-D convolutions, log-softmax"),
        ZooModel("conformer", speech.conformer, "2-layer Conformer encoder (torchaudio's layout), 2 sequences of up "
                 "to 24 frames with their lengths"),
        ZooModel("yolo", detection.tiny_yolo, "YOLO-style detector (128x128, 4 classes): SiLU backbone, nearest-upsample "
                 "neck, two heads decoded to boxes (sigmoid, grid, anchors)"),
        ZooModel("digits", trained.digits, "small CNN trained (in seconds) on scikit-learn's 8x8 digits",
                 trained.digits_data),
        ZooModel("waves", trained.waves, "1-D conv net trained on synthetic noisy waveforms (5 classes)",
                 trained.waves_data),
    )
}


def load_model(spec: str, input_shapes: list | None = None) -> tuple[str, torch.nn.Module, tuple]:
    """``mv2``, ``torchvision:mobilenet_v3_small`` (``field.SOURCES``) or ``path/file.py:Name`` -> (name, eval-mode
    module, example inputs); ``input_shapes`` (``inputs.InputSpec``s, or float shapes) replace the inputs."""
    if spec in MODELS:
        module, inputs = MODELS[spec].factory()
        return spec, module.eval(), inputs
    if spec.partition(":")[0] in field.SOURCES:
        module, inputs = field.load_field_model(spec)
        if input_shapes:
            inputs = example_inputs(input_shapes)
        return spec.partition(":")[2].rsplit("/", 1)[-1], module, inputs
    if ":" not in spec and not spec.endswith(".py"):
        raise TosakitError(f"unknown model {spec!r}",
                           f"{did_you_mean(spec, MODELS)}; or a field model: {', '.join(f'{s}:NAME' for s in field.SOURCES)}"
                           "; or give a file: path/to/model.py:ClassOrFactory")
    path, _, attr = spec.partition(":")
    return _load_from_file(Path(path), attr, input_shapes)


def _load_from_file(path: Path, attr: str, input_shapes) -> tuple[str, torch.nn.Module, tuple]:
    if not path.is_file():
        raise TosakitError(f"model file {path} not found", "give an existing .py file: path/to/model.py:ClassName")
    mod_name = f"_tosakit_user_{path.stem}"
    if importlib.util.find_spec("torchvision") and any(
            p in path.read_text(errors="replace") for p in ("torchvision", "timm", "transformers")):
        field.import_torchvision()  # PyPI's CUDA torchvision, beside torch's CPU wheel: as for -m torchvision:NAME
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise TosakitError(f"importing {path} failed: {type(exc).__name__}: {exc}",
                           "fix the error in the model file (run it with python first)") from exc
    attr = attr or _guess_attr(module, path)
    if not hasattr(module, attr):
        names = [n for n, v in vars(module).items() if _is_candidate(v)]
        raise TosakitError(f"{path} has no {attr!r}", did_you_mean(attr, names))
    obj = getattr(module, attr)
    inputs = None
    if inspect.isclass(obj) and issubclass(obj, torch.nn.Module):
        model = _call_user(obj, path, attr)
    elif isinstance(obj, torch.nn.Module):
        model = obj
    elif callable(obj):
        made = _call_user(obj, path, attr)
        model, inputs = made if isinstance(made, tuple) else (made, None)
    else:
        raise TosakitError(f"{path}:{attr} is not a torch.nn.Module, a Module class or a factory",
                           "point at a Module class, an instance, or a function returning (module, example_inputs)")
    if not isinstance(model, torch.nn.Module):
        raise TosakitError(f"{path}:{attr} did not give a torch.nn.Module (got {type(model).__name__})",
                           "return a Module, or (module, example_inputs)")
    inputs = inputs or getattr(model, "example_inputs", None) or getattr(module, "example_inputs", None)
    if callable(inputs):
        inputs = inputs()
    if input_shapes:
        inputs = example_inputs(input_shapes)
    if inputs is None:
        raise TosakitError(f"{path}:{attr} gives no example inputs",
                           "pass --input-shape 1,3,224,224 (repeat for more inputs), or define example_inputs")
    if not isinstance(inputs, tuple):
        inputs = tuple(inputs) if isinstance(inputs, list) else (inputs,)
    return attr, model.eval(), inputs


def _call_user(factory, path: Path, attr: str):
    """``factory()`` from the user's file; an exception in it is the user's error, named with its line."""
    try:
        return factory()
    except Exception as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path.resolve()]
        where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames and frames[-1].line else ""
        raise TosakitError(f"building {path}:{attr} failed: {type(exc).__name__}: {first_line(exc)}{where}",
                           f"fix {path} (check that {attr}() runs in python)") from None


def _is_candidate(v) -> bool:
    return (inspect.isclass(v) and issubclass(v, torch.nn.Module)) or isinstance(v, torch.nn.Module)


def _guess_attr(module, path: Path) -> str:
    own = [n for n, v in vars(module).items() if _is_candidate(v) and getattr(v, "__module__", "") == module.__name__]
    if len(own) == 1:
        return own[0]
    raise TosakitError(f"{path} defines {len(own)} models ({', '.join(own) or 'none'}); which one?",
                       f"name it: {path}:ClassName")
