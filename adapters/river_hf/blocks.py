"""One decoder block as a plain function over the HF layer's own submodules.

Norms, activation and rotary tables are the model's own modules, so full depth matches
transformers' numerics; attention is ours, because the cache is ours. A river block is the same
block with its seven projections swapped for quantized ones.
"""

from __future__ import annotations

from typing import Callable

import attrs
import torch
import torch.nn.functional as F

from river_core.config import RiverSpec

from .quant import QuantLinear

PROJECTIONS = ("q", "k", "v", "o", "gate", "up", "down")


@attrs.define
class Block:
    input_norm: Callable
    pre_mlp_norm: Callable
    post_attn_norm: Callable | None   # Gemma's sandwich norms
    post_mlp_norm: Callable | None
    q_norm: Callable | None           # Qwen3, Gemma 3
    k_norm: Callable | None
    q: Callable
    k: Callable
    v: Callable
    o: Callable
    gate: Callable
    up: Callable
    down: Callable
    act: Callable
    head_dim: int
    scaling: float
    window: int | None
    rope_key: str | None

    @classmethod
    def from_hf(cls, layer, sandwich: bool, window: int | None, rope_key: str | None) -> "Block":
        attn, mlp = layer.self_attn, layer.mlp
        return cls(
            input_norm=layer.input_layernorm,
            pre_mlp_norm=layer.pre_feedforward_layernorm if sandwich
            else layer.post_attention_layernorm,
            post_attn_norm=layer.post_attention_layernorm if sandwich else None,
            post_mlp_norm=layer.post_feedforward_layernorm if sandwich else None,
            q_norm=getattr(attn, "q_norm", None), k_norm=getattr(attn, "k_norm", None),
            q=attn.q_proj, k=attn.k_proj, v=attn.v_proj, o=attn.o_proj,
            gate=mlp.gate_proj, up=mlp.up_proj, down=mlp.down_proj, act=mlp.act_fn,
            head_dim=attn.head_dim, scaling=attn.scaling, window=window, rope_key=rope_key)

    def quantized(self, spec: RiverSpec) -> tuple["Block", float]:
        """The river stand-in, and its relative weight error over all projections."""
        quant = {name: QuantLinear(getattr(self, name), spec) for name in PROJECTIONS}
        sq = sum(q.error ** 2 * getattr(self, n).weight.float().pow(2).sum()
                 for n, q in quant.items())
        total = sum(getattr(self, n).weight.float().pow(2).sum() for n in PROJECTIONS)
        return attrs.evolve(self, **quant), float((sq / total).sqrt())


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def project_kv(b: Block, x: torch.Tensor, cos, sin):
    """Normalised input -> (q, k, v) as [batch, heads, tokens, head_dim], rotary applied."""
    batch, tokens, _ = x.shape
    shape = (batch, tokens, -1, b.head_dim)
    q = b.q(x).view(shape).transpose(1, 2)
    k = b.k(x).view(shape).transpose(1, 2)
    v = b.v(x).view(shape).transpose(1, 2)
    if b.q_norm is not None:
        q, k = b.q_norm(q), b.k_norm(k)
    return rope(q, cos, sin), rope(k, cos, sin), v


def forward(b: Block, x: torch.Tensor, step, cache_k: torch.Tensor, cache_v: torch.Tensor,
            rows, holes: torch.Tensor | None = None) -> torch.Tensor:
    """x: [batch, tokens, hidden] for `rows` of the batch (None: all). Writes the cache.
    holes: this layer's absent entries, or None."""
    cos, sin = step.rope(b.rope_key, rows)
    q, k, v = project_kv(b, b.input_norm(x), cos, sin)
    step.write(cache_k, cache_v, k, v, rows)
    keys, values = step.read(cache_k, cache_v, rows, b.window)
    mask = step.mask(b.window, rows, holes)
    a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=b.scaling,
                                       is_causal=mask is None and q.shape[2] > 1,
                                       enable_gqa=True)
    a = b.o(a.transpose(1, 2).reshape(*x.shape[:2], -1))
    if b.post_attn_norm is not None:
        a = b.post_attn_norm(a)
    x = x + a
    h = b.pre_mlp_norm(x)
    m = b.down(b.act(b.gate(h)) * b.up(h))
    if b.post_mlp_norm is not None:
        m = b.post_mlp_norm(m)
    return x + m
