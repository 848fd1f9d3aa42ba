"""Weight transforms a user opts into before quantization, per module: 2:4 structured pruning and weight clustering.

Each is a ``torch.nn.utils.parametrize`` parametrization of a convolution's or linear layer's weight, so the model
stays a PyTorch model to fine-tune: a pruned weight keeps its zeros (a fixed mask), a clustered weight keeps its
shared values (trainable, each weight an index into them). Export captures the transformed weights as constants
(``capture.export`` bakes the parametrizations into a copy). Vela rewards both: on Ethos-U85 a 2:4-sparse weight
runs in its sparse format (half the MACs), and few distinct values encode to fewer bytes on every Ethos-U."""

from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn
from torch.nn.utils import parametrize

from ..errors import TosakitError

LAYERS = (nn.Conv1d, nn.Conv2d, nn.Linear)
Selection = Iterable[str | type] | None  # module names (and their children) or types; None: every layer


class TwoOfFour(nn.Module):
    """The weight with a fixed mask: in every 4 consecutive input channels, the 2 of smallest magnitude are 0."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        groups = weight.detach().reshape(weight.shape[0], weight.shape[1] // 4, 4, -1)
        keep = groups.abs().argsort(dim=2, descending=True, stable=True)[:, :, :2]
        mask = torch.zeros_like(groups).scatter_(2, keep, 1.0)
        self.register_buffer("mask", mask.reshape(weight.shape))

    def forward(self, weight):
        return weight * self.mask


class Clustered(nn.Module):
    """The weight as ``n`` shared levels in [-1, 1] (trainable; -1 and 1 among them) times each output channel's
    largest magnitude (or the tensor's, ``per_channel=False``), each weight indexed to its nearest level by 1-D
    k-means (quantile start, float64 Lloyd steps). Per-channel symmetric int8 quantization then maps every
    channel onto the same ``n`` integers, which Vela's weight encoder stores as a small palette."""

    def __init__(self, weight: torch.Tensor, n: int, per_channel: bool):
        super().__init__()
        w = weight.detach().double().reshape(weight.shape[0], -1)
        scale = w.abs().amax(dim=1, keepdim=True) if per_channel else w.abs().amax().expand(w.shape[0], 1)
        x = (w / scale.clamp(min=1e-30)).reshape(-1)
        levels = torch.quantile(x, torch.linspace(0, 1, n, dtype=torch.float64))
        levels[0], levels[-1] = -1.0, 1.0
        for _ in range(20):
            index = (x[:, None] - levels[None, :]).abs().argmin(-1)
            sums = torch.zeros_like(levels).scatter_add_(0, index, x)
            counts = torch.zeros_like(levels).scatter_add_(0, index, torch.ones_like(x))
            levels = torch.where(counts > 0, sums / counts.clamp(min=1), levels)
            levels[0], levels[-1] = -1.0, 1.0  # each channel keeps its largest magnitude: its scale holds
        self.levels = nn.Parameter(levels.to(weight.dtype))
        self.register_buffer("scale", scale.to(weight.dtype))
        self.register_buffer("index", index.reshape(w.shape))
        self.shape = tuple(weight.shape)

    def forward(self, weight):
        return (self.levels[self.index] * self.scale).reshape(self.shape)


def _selected(model: nn.Module, modules: Selection, fits: Callable[[nn.Module], bool]) -> list[tuple[str, nn.Module]]:
    """The layers ``modules`` names (all when None) that the transform ``fits``."""
    chosen = list(modules) if modules is not None else None

    def named(name: str, module: nn.Module) -> bool:
        if chosen is None:
            return True
        return any(isinstance(c, type) and isinstance(module, c) or isinstance(c, str) and
                   (name == c or name.startswith(c + ".")) for c in chosen)

    found = [(name, m) for name, m in model.named_modules() if isinstance(m, LAYERS) and named(name, m) and fits(m)]
    if chosen is not None and not found:
        raise TosakitError(f"no convolution or linear layer among {chosen} takes this weight transform",
                           "name modules by their path in model.named_modules() or by type (nn.Conv2d)")
    return found


def prune_2_4(model: nn.Module, modules: Selection = None,
              fine_tune: Callable[[nn.Module], None] | None = None) -> nn.Module:
    """2:4 structured sparsity, by magnitude, on each selected layer whose input channels come in fours (grouped
    and depthwise convolutions with fewer per group are left dense); ``fine_tune(model)``, when given, then
    trains it with the zeros kept. Returns ``model``, changed in place."""
    def fits(m):
        return m.weight.dim() >= 2 and m.weight.shape[1] % 4 == 0 and m.weight.shape[1] >= 4

    for _, module in _selected(model, modules, fits):
        parametrize.register_parametrization(module, "weight", TwoOfFour(module.weight))
    if fine_tune is not None:
        fine_tune(model)
    return model


def cluster_weights(model: nn.Module, values: int = 16, per_channel: bool = True, modules: Selection = None,
                    fine_tune: Callable[[nn.Module], None] | None = None) -> nn.Module:
    """Each selected layer's weight clustered to ``values`` shared levels, scaled per output channel (or for the
    whole tensor), see ``Clustered``; ``fine_tune(model)``, when given, then trains the levels. Returns
    ``model``, changed in place."""
    if not 2 <= values <= 256:
        raise TosakitError(f"cluster_weights(values={values}): int8 weights hold at most 256 distinct values",
                           "give 2..256 (16 is typical)")
    for _, module in _selected(model, modules, lambda m: m.weight.numel() > values):
        parametrize.register_parametrization(module, "weight", Clustered(module.weight, values, per_channel))
    if fine_tune is not None:
        fine_tune(model)
    return model
