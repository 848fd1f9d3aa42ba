"""A decoder-only language model with a static KV cache, for prefill and decode programs: SmolLM2's (Llama's)
architecture — RMSNorm, rotary position embeddings, grouped-query attention, SiLU-gated MLP, tied embeddings — with
its module names, so a ``LlamaForCausalLM``'s state dict loads into it unchanged.

The cache is either state the caller keeps — ``forward(tokens, positions, *caches)`` returns the logits and every
layer's key and value cache with the new positions written (``cache[:, :, positions] = k``, a SCATTER on the NPU)
— or, with ``cache_in_place``, each attention's own buffers, updated in place as ExecuTorch's Llama export does it
(``forward(tokens, positions) -> (logits,)``): the program keeps them between calls. One module exports twice: a
prompt of T tokens (prefill) and one token (decode). Rotary angles are table rows read at
the positions (GATHER), and the attention mask compares the cache's positions with them, so nothing in the graph
depends on the step but its inputs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class DecoderConfig:
    """A Llama-architecture decoder's sizes; ``max_positions`` is the KV cache's length."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_positions: int = 64
    rope_theta: float = 100000.0
    rms_norm_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def cache_shape(self) -> tuple[int, int, int, int]:
        return (1, self.num_key_value_heads, self.max_positions, self.head_dim)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: DecoderConfig, cache_in_place: bool = False):
        super().__init__()
        self.c = c
        if cache_in_place:  # not in the state dict: a LlamaForCausalLM's loads unchanged
            self.register_buffer("k_cache", torch.zeros(c.cache_shape()), persistent=False)
            self.register_buffer("v_cache", torch.zeros(c.cache_shape()), persistent=False)
        d = c.head_dim
        self.q_proj = nn.Linear(c.hidden_size, c.num_attention_heads * d, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * d, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_key_value_heads * d, bias=False)
        self.o_proj = nn.Linear(c.num_attention_heads * d, c.hidden_size, bias=False)

    def _per_head(self, cache):
        """Each key/value head repeated for the query heads that share it (grouped-query attention)."""
        c = self.c
        groups = c.num_attention_heads // c.num_key_value_heads
        return cache[:, :, None].expand(1, c.num_key_value_heads, groups, c.max_positions, c.head_dim).reshape(
            1, c.num_attention_heads, c.max_positions, c.head_dim)

    def forward(self, x, cos, sin, positions, mask, k_cache, v_cache):
        c, t = self.c, x.shape[1]
        q = self.q_proj(x).view(1, t, c.num_attention_heads, c.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(1, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(1, t, c.num_key_value_heads, c.head_dim).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if k_cache is None:  # the module's own cache, written in place
            k_cache, v_cache = self.k_cache, self.v_cache
        else:
            k_cache, v_cache = k_cache.clone(), v_cache.clone()
        k_cache[:, :, positions] = k
        v_cache[:, :, positions] = v
        keys, values = self._per_head(k_cache), self._per_head(v_cache)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(1, t, -1)), k_cache, v_cache


class MLP(nn.Module):
    def __init__(self, c: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: DecoderConfig, cache_in_place: bool = False):
        super().__init__()
        self.self_attn = Attention(c, cache_in_place)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, positions, mask, k_cache, v_cache):
        h, k_cache, v_cache = self.self_attn(self.input_layernorm(x), cos, sin, positions, mask, k_cache, v_cache)
        x = x + h
        return x + self.mlp(self.post_attention_layernorm(x)), k_cache, v_cache


class Body(nn.Module):
    def __init__(self, c: DecoderConfig, cache_in_place: bool = False):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c, cache_in_place) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class Decoder(nn.Module):
    """``forward(tokens [1, T] int32, positions [T] int32, k0, v0, k1, v1, ...) -> (logits [1, T, V], k0', v0', ...)``
    with every cache ``[1, kv_heads, max_positions, head_dim]``; with ``cache_in_place``,
    ``forward(tokens, positions) -> (logits,)`` and the caches are the attentions' buffers."""

    def __init__(self, c: DecoderConfig, cache_in_place: bool = False):
        super().__init__()
        self.config, self.cache_in_place = c, cache_in_place
        self.model = Body(c, cache_in_place)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.lm_head.weight = self.model.embed_tokens.weight  # tied, as SmolLM2's
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.float64) / c.head_dim))
        angles = torch.arange(c.max_positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos_table", angles.cos().float(), persistent=False)
        self.register_buffer("sin_table", angles.sin().float(), persistent=False)

    def empty_caches(self) -> list[torch.Tensor]:
        """Zeroed key and value caches, layer by layer (k0, v0, k1, v1, ...); none when they are the model's own."""
        if self.cache_in_place:
            return []
        return [torch.zeros(self.config.cache_shape()) for _ in range(2 * self.config.num_hidden_layers)]

    def forward(self, tokens, positions, *caches):
        caches = caches or (None,) * (2 * self.config.num_hidden_layers)
        cos, sin = self.cos_table[positions], self.sin_table[positions]
        seen = torch.arange(self.config.max_positions, dtype=torch.int32)
        mask = (seen[None, :] <= positions[:, None])[None, None]  # a query sees the cache up to its position
        x, written = self.model.embed_tokens(tokens), []
        for i, layer in enumerate(self.model.layers):
            x, k, v = layer(x, cos, sin, positions, mask, caches[2 * i], caches[2 * i + 1])
            written += [k, v]
        logits = self.lm_head(self.model.norm(x))
        return (logits,) if self.cache_in_place else (logits, *written)


def prefill_inputs(model: Decoder, prompt: torch.Tensor) -> tuple:
    """The prefill program's inputs: the prompt [1, T] int32, positions 0..T-1, empty caches."""
    positions = torch.arange(prompt.shape[1], dtype=torch.int32)
    return (prompt.to(torch.int32), positions, *model.empty_caches())


def decode_inputs(token: int, position: int, caches) -> tuple:
    """The decode program's inputs: one token at ``position``, the caches so far."""
    return (torch.tensor([[token]], dtype=torch.int32), torch.tensor([position], dtype=torch.int32), *caches)

