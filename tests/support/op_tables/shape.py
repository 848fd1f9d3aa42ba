"""Data movement and reductions. Cases named ``conv_*`` run the op on a convolution's output, which sits in NHWC
order inside the delegate."""

from __future__ import annotations

import torch
from torch import nn

from support.op_cases import ALL, OpCase, OpTable

F = nn.functional


class Op(nn.Module):
    """``fn`` applied to the inputs (after a 1x1 convolution on the first one when ``conv``)."""

    def __init__(self, fn, conv: bool = False):
        super().__init__()
        self.fn = fn
        self.conv = nn.Conv2d(3, 6, 1) if conv else None

    def forward(self, x, *rest):
        return self.fn(self.conv(x) if self.conv is not None else x, *rest)


IDX = torch.tensor([2, 0, 1, 1])
GATHER_IDX = torch.tensor([[[0, 2, 1]], [[1, 1, 0]]])
POSITIONS = torch.tensor([5, 2], dtype=torch.int32)  # an input: positions known only at run time (a KV cache's)
ROWS = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))  # a table read at those positions (rotary)


def _write_rows(cache, pos, values, dim=2):
    """A KV cache written at run-time positions, as models write it (in place, on a copy)."""
    cache = cache.clone()
    cache[(slice(None),) * dim + (pos,)] = values
    return cache


NO_GATHER = ("fp", "int", "u85")  # Ethos-U55/U65 have no GATHER (refusal tested below)
def _op(fn, shapes, conv: bool, flavours=ALL) -> OpCase:
    return OpCase(lambda: Op(fn, conv), shapes, flavours)


CASES = {
    # layout
    "transpose": _op(lambda x: x.transpose(1, 2), [(2, 3, 5)], False),
    "conv_transpose_hw": _op(lambda x: x.transpose(2, 3), [(1, 3, 4, 5)], True),
    "squeeze": _op(lambda x: x.squeeze(1), [(2, 1, 5)], False),
    "conv_squeeze_h": _op(lambda x: x[:, :, :1].squeeze(2), [(1, 3, 4, 5)], True),
    "unsqueeze": _op(lambda x: x.unsqueeze(-1), [(2, 3, 4)], False),
    "conv_unsqueeze": _op(lambda x: x.unsqueeze(1), [(1, 3, 4, 5)], True),
    # slicing
    "slice": _op(lambda x: x[:, 1:4], [(2, 6, 3)], False),
    "slice_step2_odd": _op(lambda x: x[:, ::2], [(2, 7, 3)], False),
    "conv_slice_channels_step2": _op(lambda x: x[:, 1::2, :, 1:], [(1, 3, 4, 5)], True),
    "select": _op(lambda x: x[:, -1], [(2, 3, 4)], False),
    "conv_select_channel": _op(lambda x: x[:, 2], [(1, 3, 4, 5)], True),
    "split": _op(lambda x: x.split([1, 3], 1)[1], [(2, 4, 3)], False),
    "chunk_both": _op(lambda x: torch.cat(x.chunk(2, -1)[::-1], -1), [(2, 3, 6)], False),
    "unbind": _op(lambda x: x.unbind(0)[1], [(2, 3, 4)], False),
    "index_select": _op(lambda x: x.index_select(1, IDX), [(2, 3, 5)], False),
    "conv_index_select": _op(lambda x: x.index_select(1, IDX), [(1, 3, 4, 5)], True),
    "gather": _op(lambda x: x.gather(1, GATHER_IDX), [(2, 3, 3)], False, NO_GATHER),
    # indices computed at run time (int32 inputs): GATHER and SCATTER rows
    "index_rows": _op(lambda x, pos: x + ROWS[pos], [(2, 8), POSITIONS], False, NO_GATHER),
    "index_select_at_positions": _op(lambda x, pos: x.index_select(1, pos), [(2, 16, 3), POSITIONS], False,
                                     NO_GATHER),
    "index_put_rows": _op(_write_rows, [(1, 2, 16, 8), POSITIONS, (1, 2, 2, 8)], False, NO_GATHER),
    "index_put_broadcast": _op(lambda c, pos, v: _write_rows(c, pos, v, dim=1), [(3, 16, 4), POSITIONS, (4,)],
                               False, NO_GATHER),
    # joining, repeating, padding, reversing
    "cat": _op(lambda x, y: torch.cat([x, y], 1), [(1, 2, 3, 4), (1, 3, 3, 4)], False),
    # a KV cache's first step (transformers' DynamicCache): the cache so far is empty and the cat drops it
    "cat_empty": _op(lambda x, y: torch.cat([x[:, :0], y], 1), [(1, 3, 8), (1, 4, 8)], False),
    # ShuffleNet's channel shuffle on channels-last data, then its split: views that split and merge channels
    "conv_channel_shuffle": _op(lambda x: x.view(1, 2, 3, 4, 5).transpose(1, 2).reshape(1, 6, 4, 5).chunk(2, 1)[1],
                                [(1, 3, 4, 5)], True),
    "conv_view_split_channels": _op(lambda x: x.view(1, 2, 3, 20), [(1, 3, 4, 5)], True),
    "cat_scaled": _op(lambda x, y: torch.cat([x, 4 * y], -1), [(2, 3, 4), (2, 3, 2)], False),
    "conv_cat_channels": _op(lambda x: torch.cat([x, -x[:, :2]], 1), [(1, 3, 4, 5)], True),
    "conv_cat_with_input": _op(lambda x, y: torch.cat([x, y], 1), [(1, 3, 4, 5), (1, 2, 4, 5)], True),
    "stack": _op(lambda x, y: torch.stack([x, y], 1), [(2, 3, 4), (2, 3, 4)], False),
    "expand": _op(lambda x: x.expand(2, 3, 4, 5), [(3, 1, 5)], False),
    "repeat": _op(lambda x: x.repeat(2, 1, 3), [(3, 4)], False),
    "conv_repeat": _op(lambda x: x.repeat(1, 1, 2, 1), [(1, 3, 4, 5)], True),
    "pad_constant": _op(lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), [(1, 3, 4, 5)], False),
    "conv_pad_channels": _op(lambda x: F.pad(x, (0, 0, 0, 0, 1, 1)), [(1, 3, 4, 5)], True),
    "pad_reflect": _op(lambda x: F.pad(x, (2, 1, 1, 0), mode="reflect"), [(1, 3, 4, 5)], False),
    "conv_pad_replicate": _op(lambda x: F.pad(x, (1, 1, 2, 0), mode="replicate"), [(1, 3, 4, 5)], True),
    "flip": _op(lambda x: x.flip(0, 2), [(2, 3, 4)], False),
    "conv_flip": _op(lambda x: x.flip(1, 3), [(1, 3, 4, 5)], True),
    # reductions
    "sum": _op(lambda x: x.sum(1), [(2, 5, 3)], False),
    "sum_all": _op(lambda x: x.sum(), [(2, 3, 4)], False),
    "conv_sum_channels_keepdim": _op(lambda x: x.sum(1, keepdim=True), [(1, 3, 4, 5)], True),
    "mean_channels": _op(lambda x: x.mean(1), [(1, 3, 4, 5)], True),
    "mean_all": _op(lambda x: x.mean(), [(2, 3, 4)], False),
    "amax": _op(lambda x: x.amax((1, 2), keepdim=True), [(2, 3, 4)], False),
    "conv_amin_channels": _op(lambda x: x.amin(1), [(1, 3, 4, 5)], True),
    "max_all": _op(lambda x: x.max(), [(2, 3, 4)], False),
    "var": _op(lambda x: x.var(1), [(2, 8, 3)], False),
    "cumsum": _op(lambda x: x.cumsum(-1), [(2, 3, 8)], False),
    "conv_cumsum_channels": _op(lambda x: x.cumsum(1), [(1, 3, 4, 5)], True),
    "conv_var_population": _op(lambda x: x.var((2, 3), correction=0, keepdim=True), [(1, 3, 4, 5)], True),
    # vector norms: F.normalize (XCiT's cross-covariance attention, CLIP's embeddings)
    "vector_norm": _op(lambda x: torch.linalg.vector_norm(x, dim=-1), [(2, 3, 8)], False),
    "vector_norm_1_keepdim": _op(lambda x: torch.linalg.vector_norm(x, 1, dim=(0, 2), keepdim=True), [(2, 3, 8)],
                                 False),
    "vector_norm_inf": _op(lambda x: torch.linalg.vector_norm(x, float("inf"), dim=1), [(2, 3, 8)], False),
    "normalize": _op(lambda x: F.normalize(x, dim=-1), [(2, 4, 16)], False),
    "conv_normalize_channels": _op(lambda x: F.normalize(x, dim=1), [(1, 3, 4, 5)], True),
}

TABLE = OpTable("ops_shape", CASES, u55_limit="Ethos-U55/U65")
