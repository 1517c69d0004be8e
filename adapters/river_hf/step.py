"""The per-step context every block of one forward pass shares."""

from __future__ import annotations

import torch

from river_core.layout import Layout
from river_models.torch_blocks import Rotaries


class Step:
    """Cache slots start..end-1 of every sequence: rotary tables, masks and cache reads, built
    once per step from the layout and shared by all layers."""

    def __init__(self, layout: Layout, start: int, end: int, rotaries: Rotaries,
                 dtype, device, draft_window: int | None = None) -> None:
        self.layout, self.start, self.end = layout, start, end
        self.draft_window = draft_window
        self._device = device
        positions = layout.positions(start, end)
        self._ropes = rotaries.tables(positions, dtype)
        self._query_scale = rotaries.query_scales(positions, dtype)
        self._masks: dict = {}

    def query_scale(self, rows):
        qs = self._query_scale
        return qs if qs is None or rows is None else qs[rows]

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
