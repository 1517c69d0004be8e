"""The transformers + PyTorch reference backend."""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F

from river_core.backend import Capabilities, Footprint, Prefill
from river_core.config import RiverSpec

from . import compat
from .blocks import PROJECTIONS, Block, forward, project_kv
from .cache import KVCache, Step


class HFTokenizer:
    def __init__(self, tokenizer, eos_ids: Sequence[int]) -> None:
        self.hf = tokenizer
        self.eos_ids = frozenset(eos_ids)

    def encode(self, text: str) -> list[int]:
        return list(self.hf(text)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def chat(self, prompt: str) -> list[int]:
        return compat.chat_ids(self.hf, prompt)


class HFBackend:
    """Runs a transformers causal LM layer by layer over River's own preallocated cache."""

    name = "hf"

    def __init__(self, model, tokenizer, river: RiverSpec = RiverSpec()) -> None:
        config = model.config
        compat.check_architecture(config)
        inner = compat.inner(model)
        self.model = model
        self._embed, self._norm, self._head = inner.embed_tokens, inner.norm, model.lm_head
        self._rotary_fn = compat.rotary(inner)
        self._softcap = compat.final_softcap(config)
        sandwich = compat.SUPPORTED[config.model_type]
        self.blocks = [Block.from_hf(layer, sandwich, w, r) for layer, w, r in
                       zip(inner.layers, compat.layer_windows(config), compat.rope_keys(config))]
        with torch.inference_mode():
            rivers = [b.quantized(river) for b in self.blocks]
        self.rivers = [r for r, _ in rivers]
        self.river_error = [e for _, e in rivers]
        self.river_spec = river
        self.num_layers = len(self.blocks)
        self.max_positions = config.max_position_embeddings
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.capabilities = Capabilities(mask=True, recompute=True, devices=("cpu", "cuda"))
        self.tokenizer = HFTokenizer(tokenizer, compat.eos_ids(model, tokenizer))
        self._kv_heads = config.num_key_value_heads
        self._cache: KVCache | None = None
        self._pad: torch.Tensor | None = None
        self._valid: torch.Tensor | None = None
        self._step: Step | None = None
        self._offset = 0

    @property
    def offset(self) -> int:
        return self._offset

    @torch.inference_mode()
    def prefill(self, prompts, capacity: int) -> Prefill:
        batch, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros(batch, width, dtype=torch.long)
        pad = torch.tensor([width - len(p) for p in prompts])
        for r, p in enumerate(prompts):
            ids[r, width - len(p):] = torch.tensor(p)
        ids, pad = ids.to(self.device), pad.to(self.device)
        slots = torch.arange(capacity, device=self.device)
        self._valid = None if int(pad.max()) == 0 else slots[None, :] >= pad[:, None]
        self._pad = pad
        self._cache = KVCache(self.num_layers, batch, self._kv_heads, capacity,
                              self.blocks[0].head_dim, self.dtype, self.device)
        h = self._begin(ids, 0)
        valid = (slots[None, :width] >= pad[:, None]).to(torch.float32)
        similarity = []
        for i, block in enumerate(self.blocks):
            out = forward(block, h, self._step, self._cache.k[i], self._cache.v[i], None)
            cos = F.cosine_similarity(h.float(), out.float(), dim=-1)
            similarity.append((cos * valid).sum(1) / valid.sum(1))
            h = out
        self._offset = width
        return Prefill(self.logits(h), torch.stack(similarity, 1).cpu().numpy())

    def _begin(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        h = self._embed(ids)
        self._step = self._make_step(start, start + ids.shape[1], h)
        return h

    def _make_step(self, start: int, end: int, like: torch.Tensor) -> Step:
        positions = (torch.arange(start, end, device=self.device)[None, :]
                     - self._pad[:, None]).clamp(min=0)
        # the rotary module reads only the dtype and device of its first argument
        return Step(start, end, positions, self._valid,
                    lambda pos, key: self._rotary_fn(like, pos, key))

    @torch.inference_mode()
    def embed(self, tokens: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor(tokens, device=self.device)[:, None]
        return self._begin(ids, self._offset)

    def _run(self, block: Block, i: int, h: torch.Tensor, rows) -> torch.Tensor:
        k, v, holes = self._cache.k[i], self._cache.v[i], self._cache.holes(i)
        if rows is None:
            return forward(block, h, self._step, k, v, None, holes)
        idx = torch.tensor(rows, device=self.device)
        out = h.clone()
        out[idx] = forward(block, h[idx], self._step, k, v, idx, holes)
        return out

    @torch.inference_mode()
    def layer(self, i: int, h, rows):
        return self._run(self.blocks[i], i, h, rows)

    @torch.inference_mode()
    def river_layer(self, i: int, h, rows):
        return self._run(self.rivers[i], i, h, rows)

    @torch.inference_mode()
    def layer_span(self, i: int, states, start: int):
        h = torch.cat(states, dim=1)
        span = self._make_step(start, self._step.end, h)
        out = forward(self.blocks[i], h, span, self._cache.k[i], self._cache.v[i], None,
                      self._cache.holes(i))
        return list(out.split(1, dim=1))

    @torch.inference_mode()
    def project_kv(self, i: int, h, rows) -> None:
        block = self.blocks[i]
        idx = None if rows is None else torch.tensor(rows, device=self.device)
        x = h if idx is None else h[idx]
        cos, sin = self._step.rope(block.rope_key, idx)
        _, k, v = project_kv(block, block.input_norm(x), cos, sin)
        self._step.write(self._cache.k[i], self._cache.v[i], k, v, idx)

    @torch.inference_mode()
    def skip(self, i: int, rows) -> None:
        idx = None if rows is None else torch.tensor(rows, device=self.device)
        self._cache.skip(i, idx, self._step.start)

    @torch.inference_mode()
    def similarity(self, before, after, rows) -> list[float]:
        a, b = before[:, -1], after[:, -1]
        if rows is not None:
            idx = torch.tensor(rows, device=self.device)
            a, b = a[idx], b[idx]
        return F.cosine_similarity(a.float(), b.float(), dim=-1).tolist()

    @torch.inference_mode()
    def logits(self, h):
        y = self._head(self._norm(h[:, -1]))
        if self._softcap is not None:
            y = torch.tanh(y / self._softcap) * self._softcap
        return y.float().cpu().numpy()

    def commit(self) -> None:
        self._offset += 1

    def footprint(self) -> Footprint:
        def stored(block, names=PROJECTIONS) -> int:
            return sum(_nbytes(getattr(block, name)) for name in names)

        element = torch.empty(0, dtype=self.dtype).element_size()
        return Footprint(tuple(stored(b) for b in self.blocks),
                         tuple(stored(r) for r in self.rivers),
                         tuple(stored(b, ("k", "v")) for b in self.blocks), _nbytes(self._head),
                         2 * self._kv_heads * self.blocks[0].head_dim * element)

    def kv(self, i: int):
        n = self._offset
        return (self._cache.k[i, :, :, :n].float().cpu().numpy(),
                self._cache.v[i, :, :, :n].float().cpu().numpy())


def _nbytes(linear) -> int:
    """Weight bytes of a torch Linear or a QuantLinear, as stored."""
    if hasattr(linear, "scale") and linear.q is not None:
        return linear.q.numel() * linear.q.element_size() + \
            linear.scale.numel() * linear.scale.element_size()
    w = linear.weight
    return w.numel() * w.element_size()
