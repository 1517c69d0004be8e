"""The PyTorch reference backend, built from a model package `Checkpoint`."""

from __future__ import annotations


import numpy as np
import torch
import torch.nn.functional as F

from river_core.cache import KVCache
from river_core.footprint import Footprint
from river_core.layer_engine import LayerEngine
from river_core.layout import Layout
from river_models import Checkpoint, StandIns

from river_models.torch_blocks import (Block, Dense, Norm, Rotaries, forward, packed,
                                       project_kv)
from . import CAPABILITIES
from .step import Step


# The backbone's prepacked copy (Dense.pack) makes a verification faster but costs as much to
# make as a dozen verifications save (docs/results/levers.json, verification_ms; the packing
# itself ~0.17 s on the embedded model): short generations skip it.
PACK_AFTER = 16


class HFBackend(LayerEngine):
    """Runs a model layer by layer over River's own preallocated cache."""

    name = "hf"

    def __init__(self, checkpoint: Checkpoint, stand_ins: StandIns,
                 dtype: torch.dtype = torch.float32, device: str = "cpu") -> None:
        spec, w = checkpoint.spec, checkpoint.weights
        self.spec = spec
        self.device, self.dtype = torch.device(device), dtype
        dev = self.device
        self.blocks = [Block.build(i, layer, spec, dtype, dev) for i, layer in enumerate(w.layers)]
        self.stand_ins = [Block.build(i, layer, spec, dtype, dev, q)
                          for i, (layer, q) in enumerate(zip(w.layers, stand_ins.layers))]
        self.stand_in_error = list(stand_ins.errors)
        self._embed = torch.from_numpy(w.embed).to(device=dev, dtype=dtype)
        self._head = Dense(w.head, None, dtype, dev)
        self._stand_in_head = packed(stand_ins.head, None, dtype, dev)
        self._norm = Norm.of(w.final_norm, spec, dtype, dev)
        self._rotaries = Rotaries(spec, dev)
        self.num_layers = spec.num_layers
        self.max_positions = spec.max_positions
        self.capabilities = CAPABILITIES
        self.runs_on = (str(self.device),)
        self.tokenizer = checkpoint.tokenizer
        self.step: Step | None = None
        self._extends = 0      # verifications so far: the prepacked copy comes at PACK_AFTER
        self.draft_window: int | None = None

    # -- what the engine base asks for ------------------------------------------------------

    def new_cache(self, layout: Layout) -> KVCache:
        shape = (self.num_layers, layout.batch, self.spec.kv_heads, layout.capacity,
                 self.spec.head_dim)
        return KVCache(*(torch.full(shape, float("nan"), dtype=self.dtype, device=self.device)
                         for _ in "kv"), layout)

    def begin(self, start: int, end: int) -> None:
        self.step = self._make_step(start, end)

    @torch.inference_mode()
    def embed_ids(self, ids: np.ndarray) -> torch.Tensor:
        h = self._embed[torch.from_numpy(ids).to(self.device)]
        if self.spec.embed_scale != 1.0:
            h = h * torch.tensor(self.spec.embed_scale).to(self.dtype)
        return h

    @torch.inference_mode()
    def token_similarity(self, before, after) -> np.ndarray:
        return F.cosine_similarity(before.float(), after.float(), dim=-1).cpu().numpy()

    @torch.inference_mode()
    def position_logits(self, h) -> np.ndarray:
        return self._head_of(h[0], self._head)

    def to_numpy(self, array) -> np.ndarray:
        return array.float().cpu().numpy()

    # -- the contract -----------------------------------------------------------------------

    def _make_step(self, start: int, end: int) -> Step:
        return Step(self.cache.layout, start, end, self._rotaries, self.dtype,
                    self.device, self.draft_window)

    def window_drafts(self, window: int | None) -> None:
        self.draft_window = window

    def _run(self, block: Block, i: int, h: torch.Tensor, rows, mids=None) -> torch.Tensor:
        if rows is None:
            return forward(block, i, h, self.step, self.cache, None, mids)
        idx = torch.tensor(rows, device=self.device)
        out = h.clone()
        out[idx] = forward(block, i, h[idx], self.step, self.cache, idx, mids)
        return out

    @torch.inference_mode()
    def layer(self, i: int, h, rows, sub_blocks: bool = False):
        mids: list | None = [] if sub_blocks else None
        out = self._run(self.blocks[i], i, h, rows, mids)
        if not sub_blocks:
            return out, None
        idx = slice(None) if rows is None else torch.tensor(rows, device=self.device)
        before, mid, after = h[idx, -1].float(), mids[0][:, -1].float(), out[idx, -1].float()
        return out, torch.stack([F.cosine_similarity(before, mid, dim=-1),
                                 F.cosine_similarity(mid, after, dim=-1)], -1).cpu().numpy()

    @torch.inference_mode()
    def stand_in_layer(self, i: int, h, rows):
        return self._run(self.stand_ins[i], i, h, rows)

    @torch.inference_mode()
    def layer_span(self, i: int, states, start: int):
        h = torch.cat(states, dim=1)
        span = self._make_step(start, self.step.end)
        out = forward(self.blocks[i], i, h, span, self.cache, None)
        return list(out.split(1, dim=1))

    @torch.inference_mode()
    def extend(self, tokens) -> np.ndarray:
        self._extends += 1
        if self._extends == PACK_AFTER:   # verification runs several rows: from here on in
            for block in self.blocks:      # oneDNN's prepacked kernel
                block.pack()
            self._head.pack()
        return super().extend(tokens)

    @torch.inference_mode()
    def project_kv(self, i: int, h, rows) -> None:
        block = self.blocks[i]
        idx = None if rows is None else torch.tensor(rows, device=self.device)
        x = h if idx is None else h[idx]
        cos, sin = self.step.rope(block.rope_key, idx)
        _, k, v = project_kv(block, block.input_norm(x), cos, sin)
        self.cache.write(i, idx, k, v)

    @torch.inference_mode()
    def similarity(self, before, after, rows) -> list[float]:
        a, b = before[:, -1], after[:, -1]
        if rows is not None:
            idx = torch.tensor(rows, device=self.device)
            a, b = a[idx], b[idx]
        return F.cosine_similarity(a.float(), b.float(), dim=-1).tolist()

    @torch.inference_mode()
    def logits(self, h):
        return self._head_of(h[:, -1], self._head)

    @torch.inference_mode()
    def stand_in_logits(self, h):
        return self._head_of(h[:, -1], self._stand_in_head)

    def _head_of(self, x: torch.Tensor, head) -> np.ndarray:
        """Final norm and `head` of states [..., hidden]."""
        y = head(self._norm(x))
        cap = self.spec.final_softcap
        if cap is not None:
            y = torch.tanh(y / cap) * cap
        return y.float().cpu().numpy()

    def footprint(self) -> Footprint:
        element = torch.empty(0, dtype=self.dtype).element_size()
        return Footprint(tuple(b.weight_bytes() for b in self.blocks),
                         tuple(b.weight_bytes() for b in self.stand_ins),
                         tuple(b.weight_bytes(("k", "v")) for b in self.blocks),
                         self._head.nbytes,
                         2 * self.spec.kv_heads * self.spec.head_dim * element,
                         self._stand_in_head.nbytes)
