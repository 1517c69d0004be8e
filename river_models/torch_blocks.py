"""One decoder block as plain torch functions over River's own weights: what both torch
engines run (the hf backend, and River inside vLLM). Imported only by them, so the model
package itself stays free of torch.

Built from the model package's `LayerWeights` (backbone) or its `QuantWeight`s (stand-in).
Norms, rotary and activations follow transformers' numerics operation for operation, so full
depth matches `generate()` token for token; attention is ours, because the cache is ours.
"""

from __future__ import annotations

from typing import Callable

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from .quant import QuantWeight
from .spec import FUSED, PROJECTIONS, LayerWeights, ModelSpec


class Rotaries:
    """A model's rotary tables and query scaling for the positions of one step, computed as
    transformers computes them (so full depth matches it bit for bit)."""

    def __init__(self, spec: ModelSpec, device) -> None:
        f32 = lambda f: torch.tensor(f, dtype=torch.float32, device=device)
        self._spec, self._device = spec, device
        self._freqs = {k: (r, f32(r.inv_freq), f32(r.long_inv_freq or r.inv_freq))
                       for k, r in spec.rotary.items()}

    def tables(self, positions: np.ndarray, dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """positions [batch, tokens] -> per table (cos, sin) [batch, 1, tokens, rotary dims]."""
        pos = torch.from_numpy(positions).to(self._device)
        out = {}
        for key, (rotary, short, long) in self._freqs.items():
            is_long = torch.from_numpy(rotary.is_long(positions)).to(self._device)[:, None, None]
            freqs = pos[..., None].float() * torch.where(is_long, long, short)
            emb = torch.cat((freqs, freqs), dim=-1)
            out[key] = ((emb.cos() * rotary.scaling).to(dtype).unsqueeze(1),
                        (emb.sin() * rotary.scaling).to(dtype).unsqueeze(1))
        return out

    def query_scales(self, positions: np.ndarray, dtype) -> torch.Tensor | None:
        """[batch, 1, tokens, 1] factors for q after the rotary, or None (no query scaling)."""
        qs = self._spec.query_scale
        if qs is None:
            return None
        pos = torch.from_numpy(positions).to(self._device)
        return (1 + qs.beta * torch.log(1 + torch.floor(pos / qs.period)))[:, None, :, None].to(
            dtype)


@attrs.frozen(eq=False)
class Norm:
    """RMSNorm. Gemma (`offset`) scales by 1 + w in float32 before casting back; the others
    cast back first, then scale (as transformers does)."""

    weight: torch.Tensor
    eps: float
    offset: bool

    @classmethod
    def of(cls, w: np.ndarray | None, spec: ModelSpec, dtype, device) -> "Norm | None":
        if w is None:
            return None
        t = torch.from_numpy(w).to(device)
        return cls(1.0 + t if spec.norm_offset else t.to(dtype), spec.norm_eps, spec.norm_offset)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight).type_as(x) if self.offset else self.weight * xf.to(x.dtype)


class Dense:
    """A float projection. From 4 rows at once (speculative verification) oneDNN's prepacked
    kernel runs faster than F.linear on this CPU, below that slower (docs/results/levers.md,
    "verification_ms"); so `pack` makes the prepacked copy (more memory) when verification
    first needs it, and only 4-16 rows take it."""

    ROWS = range(4, 17)

    def __init__(self, w: np.ndarray, bias: np.ndarray | None, dtype, device) -> None:
        self.weight = torch.from_numpy(w).to(device=device, dtype=dtype)
        self.bias = None if bias is None else torch.from_numpy(bias).to(device=device,
                                                                        dtype=dtype)
        self.nbytes = self.weight.numel() * self.weight.element_size()
        self._packed = None

    def pack(self) -> None:
        cpu = self.weight.device.type == "cpu" and self.weight.dtype == torch.float32
        if cpu and self._packed is None and torch.backends.mkldnn.is_available():
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None and x.numel() // x.shape[-1] in self.ROWS:
            return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def packed(q: QuantWeight, bias: np.ndarray | None, dtype, device) -> Callable:
    """A stand-in projection. On the CPU: aten's packed int8/int4 kernels with bfloat16
    activations (the fast path there); elsewhere the dequantized weights (correct, not
    faster: not run on a GPU yet)."""
    if device.type != "cpu":
        return Dense(q.dequantize(), bias, dtype, device)
    rows, _ = q.shape
    b = None if bias is None else torch.from_numpy(bias).to(dtype)
    scale = torch.from_numpy(q.scale)
    if q.bits == 8:
        w = torch.from_numpy(q.codes.astype(np.int16) - 128).to(torch.int8)
        s = scale[:, 0].to(torch.bfloat16)
        mm = lambda x: torch.ops.aten._weight_int8pack_mm(x, w, s)
        nbytes = w.numel() + s.numel() * 2
    else:
        w = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            torch.from_numpy(q.codes.astype(np.int32)), 1)
        # kernel convention: w = (code - 8) * scale + zero
        zero = (8 - torch.from_numpy(q.zero).float()) * scale
        s = torch.stack([scale.t(), zero.t()], -1).contiguous().to(torch.bfloat16)
        group = q.group
        mm = lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x, w, group, s)
        nbytes = q.codes.size // 2 + s.numel() * 2

    def linear(x: torch.Tensor) -> torch.Tensor:
        y = mm(x.reshape(-1, x.shape[-1]).to(torch.bfloat16)).to(x.dtype)
        y = y.view(*x.shape[:-1], rows)
        return y if b is None else y + b
    linear.nbytes = nbytes
    return linear


def fused(layer: LayerWeights, names, dtype, device, quantized=None) -> Callable:
    """One matmul for the projections `names` of the same input, outputs concatenated."""
    weight, bias = layer.fused(names)
    if quantized is None:
        return Dense(weight, bias, dtype, device)
    return packed(QuantWeight.stack([quantized[n] for n in names]), bias, dtype, device)


@attrs.frozen(eq=False)
class Block:
    input_norm: Norm
    pre_mlp_norm: Norm
    post_attn_norm: Norm | None   # Gemma's sandwich norms
    post_mlp_norm: Norm | None
    q_norm: Norm | None           # Qwen3, Gemma 3
    k_norm: Norm | None
    proj: dict                    # FUSED -> callable (q, k and v in one matmul; gate and up)
    splits: tuple[int, int, int]  # widths of q, k, v in the fused output
    nbytes: dict                  # PROJECTIONS -> weight bytes as stored
    act: Callable
    head_dim: int
    scaling: float
    window: int | None
    rope_key: str

    @classmethod
    def build(cls, i: int, layer: LayerWeights, spec: ModelSpec, dtype, device,
              quantized: dict[str, QuantWeight] | None = None) -> "Block":
        """Layer i of the backbone, or its stand-in when `quantized` projections are given."""
        norm = lambda w: Norm.of(w, spec, dtype, device)
        proj = {f: fused(layer, names, dtype, device, quantized) for f, names in FUSED.items()}
        per_weight = {n: proj[f].nbytes * len(layer.projections[n]) //
                      sum(len(layer.projections[m]) for m in names)
                      for f, names in FUSED.items() for n in names}
        act = F.silu if spec.activation == "silu" else lambda x: F.gelu(x, approximate="tanh")
        splits = tuple(len(layer.projections[n]) for n in FUSED["qkv"])
        return cls(norm(layer.input_norm), norm(layer.pre_mlp_norm), norm(layer.post_attn_norm),
                   norm(layer.post_mlp_norm), norm(layer.q_norm), norm(layer.k_norm), proj,
                   splits, per_weight, act, spec.head_dim, spec.attn_scale, spec.windows[i],
                   spec.rope_keys[i])

    def pack(self) -> None:
        """Prepack the float projections for verification (`Dense.pack`)."""
        for proj in self.proj.values():
            if isinstance(proj, Dense):
                proj.pack()

    def weight_bytes(self, names=PROJECTIONS) -> int:
        return sum(self.nbytes[n] for n in names)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary on the first cos.shape[-1] dimensions (all but Phi-3's partial rotary)."""
    dims = cos.shape[-1]
    if dims < x.shape[-1]:
        return torch.cat((rope(x[..., :dims], cos, sin), x[..., dims:]), dim=-1)
    half = dims // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def project_kv(b: Block, x: torch.Tensor, cos, sin, query_scale=None):
    """Normalised input -> (q, k, v) as [batch, heads, tokens, head_dim], rotary applied (and
    the query scaling, when the model has one)."""
    batch, tokens, _ = x.shape
    shape = (batch, tokens, -1, b.head_dim)
    q, k, v = (t.reshape(shape).transpose(1, 2) for t in b.proj["qkv"](x).split(b.splits, -1))
    if b.q_norm is not None:
        q, k = b.q_norm(q), b.k_norm(k)
    q = rope(q, cos, sin)
    return q if query_scale is None else q * query_scale, rope(k, cos, sin), v


def mlp(b: Block, h: torch.Tensor) -> torch.Tensor:
    """The block's MLP on its normalised input (before any post-MLP norm)."""
    gate, up = b.proj["gate_up"](h).chunk(2, dim=-1)
    return b.proj["down"](b.act(gate) * up)


def forward(b: Block, i: int, x: torch.Tensor, step, cache, rows,
            mids: list | None = None) -> torch.Tensor:
    """Layer i on x: [batch, tokens, hidden] for `rows` of the batch (None: all), over the
    step's slots of `cache` (a `river_core.KVCache`), which it writes. `mids`, when given,
    receives the state between the attention and MLP sub-blocks."""
    cos, sin = step.rope(b.rope_key, rows)
    q, k, v = project_kv(b, b.input_norm(x), cos, sin, step.query_scale(rows))
    cache.write(i, rows, k, v, step.start, step.end)
    keys, values = step.read(cache.k[i], cache.v[i], rows, b.window)
    mask = step.mask(b.window, i, rows)
    a = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=b.scaling,
                                       is_causal=mask is None and q.shape[2] > 1,
                                       enable_gqa=True)
    a = b.proj["o"](a.transpose(1, 2).reshape(*x.shape[:2], -1))
    if b.post_attn_norm is not None:
        a = b.post_attn_norm(a)
    x = x + a
    if mids is not None:
        mids.append(x)
    m = mlp(b, b.pre_mlp_norm(x))
    if b.post_mlp_norm is not None:
        m = b.post_mlp_norm(m)
    return x + m
