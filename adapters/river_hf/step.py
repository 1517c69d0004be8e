"""The per-step context every block of one forward pass shares."""

from __future__ import annotations

import torch

from river_core.layout import Layout
from river_models import ModelSpec


class Step:
    """Cache slots start..end-1 of every sequence: rotary tables, masks and cache reads, built
    once per step from the layout and shared by all layers."""

    def __init__(self, layout: Layout, start: int, end: int, spec: ModelSpec,
                 inv_freq: dict[str, torch.Tensor], dtype, device,
                 draft_window: int | None = None) -> None:
        self.layout, self.start, self.end = layout, start, end
        self.draft_window = draft_window
        self._device = device
        positions = torch.from_numpy(layout.positions(start, end)).to(device)
        self._ropes = {}
        for key, freq in inv_freq.items():
            # as transformers computes it, so rotary tables are bit-identical
            freqs = positions[..., None].float() * freq
            emb = torch.cat((freqs, freqs), dim=-1)
            scaling = spec.rotary[key].scaling
            self._ropes[key] = ((emb.cos() * scaling).to(dtype).unsqueeze(1),
                                (emb.sin() * scaling).to(dtype).unsqueeze(1))
        self._masks: dict = {}

    def rope(self, key: str, rows):
        cos, sin = self._ropes[key]
        return (cos, sin) if rows is None else (cos[rows], sin[rows])

    def _slots(self, window):
        return self.layout.key_slots(self.start, self.end, window, self.draft_window)

    def read(self, cache_k, cache_v, rows, window):
        slots = self._slots(window)
        if isinstance(slots, slice):
            picked = (slice(None) if rows is None else rows, slice(None), slots)
            return cache_k[picked], cache_v[picked]
        slots = torch.from_numpy(slots).to(self._device)   # a draft window
        k, v = cache_k.index_select(2, slots), cache_v.index_select(2, slots)
        return (k, v) if rows is None else (k[rows], v[rows])

    def mask(self, window: int | None, layer: int, rows):
        """Boolean [batch, 1, tokens, keys] (True = attend), or None for plain causal."""
        key = self.layout.mask_key(window, layer)
        if key not in self._masks:
            plain = self.layout.plain(self.start, self.end, window, layer)
            self._masks[key] = None if plain else torch.from_numpy(self.layout.mask(
                self.start, self.end, window, layer, self._slots(window))[:, None]).to(
                    self._device)
        m = self._masks[key]
        return m if m is None or rows is None else m[rows]
