"""One decoder block as plain torch functions over River's own weights: what both torch
engines run (the hf backend, and River inside vLLM). Imported only by them, so the model
package itself stays free of torch.

Built from the model package's `LayerWeights` (backbone) or its `QuantWeight`s (stand-in), run
by the skeleton (`skeleton.decoder_layer`) over `TorchLayer`'s primitives. Norms, rotary and
activations follow transformers' numerics operation for operation, so full depth matches
`generate()` token for token; attention is ours, because the cache is ours.
`TorchArrays` holds the array members of the core's `LayerEngine` (and of River inside vLLM)
for torch tensors, `torch_pass` a step's `Pass` on the engine's device.
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from river_core.contract.backend import Pass
from river_core.contract.layout import View
from river_core.settings.errors import CapabilityError
from river_models.quant import QuantWeight
from river_models.spec import FUSED, PROJECTIONS, LayerWeights, ModelSpec, QueryScale

from .skeleton import BoundLayer, Primitives


class Rotaries:
    """A model's rotary tables and query scaling for the positions of one step, computed as
    transformers computes them (so full depth matches it bit for bit)."""

    def __init__(self, spec: ModelSpec, device) -> None:
        f32 = lambda f: upload(np.asarray(f, np.float32), torch.float32, device)
        self._spec, self._device = spec, device
        self._freqs = {k: (r, f32(r.inv_freq), f32(r.long_inv_freq or r.inv_freq))
                       for k, r in spec.rotary.items()}

    def tables(self, positions: np.ndarray, dtype) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """positions [batch, tokens] -> per table (cos, sin) [batch, 1, tokens, rotary dims]."""
        pos = upload(positions, torch.int64, self._device)
        out = {}
        for key, (rotary, short, long) in self._freqs.items():
            is_long = upload(rotary.is_long(positions), torch.bool, self._device)[:, None, None]
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
        pos = upload(positions, torch.int64, self._device)
        return query_factors(qs, pos)[:, None, :, None].to(dtype)


def query_factors(qs: QueryScale, positions: torch.Tensor) -> torch.Tensor:
    """The query scaling of `positions` (int64, any shape), in float32: the rule of
    `QueryScale.factors` on the device, as transformers and vLLM compute it."""
    return 1 + qs.beta * torch.log(1 + torch.floor(positions / qs.period))


class TorchArrays:
    """The array members of a torch engine (`LayerEngine`'s, as `NumpyArrays` for numpy
    states): row indices, scatter, concatenation, cosines on the engine's device, and the one
    read of the host. The engine sets `device`."""

    device: torch.device

    def make_index(self, rows: Sequence[int]) -> torch.Tensor:
        return torch.tensor(list(rows), dtype=torch.long, device=self.device)

    @torch.inference_mode()
    def scatter(self, h, idx, rows_out):
        return h.index_copy(0, idx, rows_out)

    @torch.inference_mode()
    def concat(self, arrays, axis: int):
        return torch.cat(list(arrays), dim=axis)

    @torch.inference_mode()
    def cosines(self, pairs):
        out = []
        for a, b in pairs:   # a loop, not a comprehension: no Python call per layer
            out.append(F.cosine_similarity(a.float(), b.float(), dim=-1))
        return torch.stack(out, -1)

    @staticmethod
    def host(t: torch.Tensor) -> np.ndarray:
        """The one place a step reads the device: `t` on the host as numpy (floats as
        float32: numpy has no bfloat16)."""
        t = t.detach()
        return (t.float() if t.is_floating_point() else t).cpu().numpy()


def torch_pass(view: View, ids: np.ndarray | None, rotaries: "Rotaries",
               rope_keys: Sequence[str], dtype, device) -> Pass:
    """A step's `Pass` on `device`: each layer's rotary table and, where not plain, its
    boolean mask [batch, 1, tokens, keys] (True = attend), and the slots it reads (a
    slice, or a draft window's as an index tensor), each made once per step."""
    positions = view.positions
    tables = rotaries.tables(positions, dtype)
    made: dict = {}   # each array once: layers of one window share it
    rope, slots, masks = [], [], []
    # one loop, no comprehension or helper: each would be a Python call per step
    for key, s, m, plain in zip(rope_keys, view.slots, view.masks, view.plain):
        rope.append(tables[key])
        if not isinstance(s, slice):   # a draft window's slots
            if id(s) not in made:
                made[id(s)] = upload(s, torch.int64, device)
            s = made[id(s)]
        slots.append(s)
        if plain:
            m = None
        else:
            if id(m) not in made:
                made[id(m)] = upload(m[:, None], torch.bool, device)
            m = made[id(m)]
        masks.append(m)
    return Pass(view.step, ids, positions, rope, rotaries.query_scales(positions, dtype),
                slots, masks)


@attrs.frozen(eq=False)
class Norm:
    """RMSNorm. With `offset` it scales by 1 + w in float32 before casting back; without, it
    casts back first, then scales (as transformers does)."""

    weight: torch.Tensor
    eps: float
    offset: bool

    @classmethod
    def of(cls, w: np.ndarray | None, spec: ModelSpec, dtype, device) -> "Norm | None":
        if w is None:
            return None
        t = upload(spec.norm_scale(w), torch.float32, device)
        return cls(t if spec.norm_offset else t.to(dtype), spec.norm_eps, spec.norm_offset)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight).type_as(x) if self.offset else self.weight * xf.to(x.dtype)


class Dense:
    """A float projection."""

    def __init__(self, w: np.ndarray, bias: np.ndarray | None, dtype, device) -> None:
        self.weight = upload(w, dtype, device)
        self.bias = None if bias is None else upload(bias, dtype, device)
        self.nbytes = self.weight.numel() * self.weight.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def upload(array: np.ndarray, dtype, device) -> torch.Tensor:
    """The one way host arrays (weights, step tables) reach the engine's device."""
    return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)


def packed(q: QuantWeight, bias: np.ndarray | None, dtype, device) -> Callable:
    """A stand-in projection on a real low-bit kernel: on the CPU aten's packed int8/int4
    kernels with bfloat16 activations; elsewhere (CUDA) aten's int4 tinygemm kernel
    (`_int4_tinygemm`) and, for 8 bits (the head), the dequantized weights in the model's
    dtype."""
    rows, _ = q.shape
    if device.type != "cpu":
        if q.bits == 8:
            return Dense(q.dequantize(), bias, dtype, device)
        mm, args, nbytes = _int4_tinygemm(q, device)
    elif q.bits == 8:
        if q.scale.shape[1] != 1:
            raise CapabilityError("aten's int8 kernel takes one scale per row, not per group: "
                                  "8-bit stand-ins with the sym quantizer are the ggml engine's")
        w = torch.from_numpy(q.codes.astype(np.int16) - 128).to(torch.int8)
        s = torch.from_numpy(q.scale[:, 0]).to(torch.bfloat16)
        mm, args = torch.ops.aten._weight_int8pack_mm, (w, s)
        nbytes = w.numel() + s.numel() * 2
    else:
        w = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            torch.from_numpy(q.codes.astype(np.int32)), 1)
        s = upload(_scales_and_zeros(q), torch.bfloat16, device)
        mm, args = torch.ops.aten._weight_int4pack_mm_for_cpu, (w, q.group, s)
        nbytes = q.codes.size // 2 + s.numel() * 2
    b = None if bias is None else upload(bias, dtype, device)

    def linear(x: torch.Tensor) -> torch.Tensor:
        # the kernel itself, `mm(x, *args)`: no Python call between it and the projection
        y = mm(x.reshape(-1, x.shape[-1]).to(torch.bfloat16), *args).to(x.dtype)
        y = y.view(*x.shape[:-1], rows)
        return y if b is None else y + b
    linear.nbytes = nbytes
    return linear


def _scales_and_zeros(q: QuantWeight) -> np.ndarray:
    """[groups, rows, 2] float32: aten's int4 kernels (CPU and tinygemm alike) compute
    w = (code - 8) * scale + zero, so River's zero point (w = (code - zero) * scale) becomes
    (8 - zero) * scale."""
    return np.stack([q.scale.T, ((8 - q.zero) * q.scale).T], -1)


TINYGEMM_GROUPS = (32, 64, 128, 256)


def _int4_tinygemm(q: QuantWeight, device):
    """aten's CUDA int4 weight-only kernel (tinygemm: sm80+, bfloat16 activations): codes
    two to a byte, the even column in the high nibble (torchao's order), then tiled by
    `_convert_weight_to_int4pack` for the widest inner K tiles the width allows."""
    rows, columns = q.shape
    tiles = next((t for t in (8, 4, 2) if columns % (16 * t) == 0), None)
    if q.group not in TINYGEMM_GROUPS or tiles is None or rows % 8:
        raise CapabilityError(f"the CUDA int4 kernel takes groups of {TINYGEMM_GROUPS}, "
                              f"widths that are multiples of 32 and rows of 8; this stand-in "
                              f"projection is {rows}x{columns} in groups of {q.group}")
    codes = q.codes.astype(np.uint8)
    pairs = (codes[:, ::2] << 4) | codes[:, 1::2]
    w = torch.ops.aten._convert_weight_to_int4pack(upload(pairs, torch.uint8, device), tiles)
    s = upload(_scales_and_zeros(q), torch.bfloat16, device)
    return (torch.ops.aten._weight_int4pack_mm, (w, q.group, s),
            q.codes.size // 2 + s.numel() * 2)


def fused(layer: LayerWeights, names, dtype, device, quantized=None) -> Callable:
    """One matmul for the projections `names` of the same input, outputs concatenated."""
    weight, bias = layer.fused(names)
    if quantized is None:
        return Dense(weight, bias, dtype, device)
    return packed(QuantWeight.stack([quantized[n] for n in names]), bias, dtype, device)


@attrs.frozen(eq=False)
class Block:
    """One layer's weights on the engine's device (`weights`: its norms and fused
    projections, q, k and v in one matmul, gate and up in another) and its fixed settings."""

    weights: BoundLayer
    splits: tuple[int, int, int]  # widths of q, k, v in the fused output
    nbytes: dict                  # PROJECTIONS -> weight bytes as stored
    act: Callable
    head_dim: int
    scaling: float

    @classmethod
    def build(cls, layer: LayerWeights, spec: ModelSpec, dtype, device,
              quantized: dict[str, QuantWeight] | None = None) -> "Block":
        """A backbone layer, or its stand-in when `quantized` projections are given."""
        weights = BoundLayer.bind(lambda n: Norm.of(getattr(layer, n), spec, dtype, device),
                                  lambda f: fused(layer, FUSED[f], dtype, device, quantized))
        per_weight = {n: weights.proj[f].nbytes * len(layer.projections[n]) //
                      sum(len(layer.projections[m]) for m in names)
                      for f, names in FUSED.items() for n in names}
        act = F.silu if spec.activation == "silu" else lambda x: F.gelu(x, approximate="tanh")
        splits = tuple(len(layer.projections[n]) for n in FUSED["qkv"])
        return cls(weights, splits, per_weight, act, spec.head_dim, spec.attn_scale)

    def weight_bytes(self, names=PROJECTIONS) -> int:
        return sum(self.nbytes[n] for n in names)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotary on the first cos.shape[-1] dimensions (a partial rotary's leading ones)."""
    dims = cos.shape[-1]
    if dims < x.shape[-1]:
        return torch.cat((rope(x[..., :dims], cos, sin), x[..., dims:]), dim=-1)
    half = dims // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class TorchWeights(Primitives):
    """The skeleton's primitives of a block that need no step (norms, projections, the MLP):
    states [batch, tokens, hidden]; queries, keys and values [batch, heads, tokens,
    head_dim]."""

    def __init__(self, block: Block) -> None:
        self.block, self.layer = block, block.weights

    def norm(self, h, weight):
        return weight(h)

    def project(self, h, name: str, parts=None) -> tuple:
        y = self.layer.proj[name](h)
        if name == "gate_up":
            return y.chunk(2, dim=-1)
        if name != "qkv":
            return (y,)
        shape = (*h.shape[:2], -1, self.block.head_dim)
        heads = [a.reshape(shape).transpose(1, 2) for a in y.split(self.block.splits, -1)]
        return tuple(heads) if parts is None else tuple(heads["qkv".index(p)] for p in parts)

    def activation(self, gate):
        return self.block.act(gate)


class TorchLayer(TorchWeights):
    """The skeleton's primitives for layer i of pass `p` (`torch_pass`) on `rows` of the
    batch (None: all), over the step's slots of `cache` (a `river_core.KVCache`), which it
    writes."""

    def __init__(self, block: Block, p: Pass, i: int, cache, rows) -> None:
        super().__init__(block)
        (cos, sin), qs, mask = p.rope[i], p.query_scale, p.masks[i]
        if rows is not None:
            cos, sin = cos[rows], sin[rows]
            qs = None if qs is None else qs[rows]
            mask = None if mask is None else mask[rows]
        self.cos, self.sin, self.query_scale, self.mask = cos, sin, qs, mask
        self.p, self.i, self.cache, self.rows = p, i, cache, rows

    def rotate(self, q, k) -> tuple:
        return (None if q is None else rope(q, self.cos, self.sin)), rope(k, self.cos, self.sin)

    def write(self, k, v) -> None:
        self.cache.write(self.i, self.rows, k, v, self.p.step.start, self.p.step.end)

    def attend(self, q, k, v):
        i, rows, slots, cache = self.i, self.rows, self.p.slots[self.i], self.cache
        self.write(k, v)
        if isinstance(slots, slice):
            picked = (slice(None) if rows is None else rows, slice(None), slots)
            keys, values = cache.k[i][picked], cache.v[i][picked]
        else:   # a draft window's slots
            keys, values = cache.k[i].index_select(2, slots), cache.v[i].index_select(2, slots)
            if rows is not None:
                keys, values = keys[rows], values[rows]
        a = F.scaled_dot_product_attention(q, keys, values, attn_mask=self.mask,
                                           scale=self.block.scaling,
                                           is_causal=self.mask is None and q.shape[2] > 1,
                                           enable_gqa=True)
        return a.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)
