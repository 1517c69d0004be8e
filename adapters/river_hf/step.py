"""The per-step context every block of one forward pass shares."""

from __future__ import annotations

import torch

from river_core.backend import Step
from river_core.layout import Layout
from river_models.torch_blocks import Rotaries, upload


class StepContext:
    """A step's slots of every sequence: rotary tables (and query scales), masks and the slots
    its attention reads (a draft window's too), built once per step from the layout and shared
    by all layers; every tensor on the engine's device."""

    def __init__(self, layout: Layout, step: Step, rotaries: Rotaries, dtype, device) -> None:
        self.layout, self.start, self.end = layout, step.start, step.end
        self.draft_window = step.draft_window
        self._device = device
        positions = layout.positions(self.start, self.end)
        self._ropes = rotaries.tables(positions, dtype)
        self._query_scale = rotaries.query_scales(positions, dtype)
        self._masks: dict = {}
        self._slots: dict = {}

    def query_scale(self, rows):
        qs = self._query_scale
        return qs if qs is None or rows is None else qs[rows]

    def rope(self, key: str, rows):
        cos, sin = self._ropes[key]
        return (cos, sin) if rows is None else (cos[rows], sin[rows])

    def _key_slots(self, window):
        if window not in self._slots:   # per attention window, once per step
            slots = self.layout.key_slots(self.start, self.end, window, self.draft_window)
            self._slots[window] = slots if isinstance(slots, slice) else \
                (slots, upload(slots, torch.int64, self._device))
        return self._slots[window]

    def read(self, cache_k, cache_v, rows, window):
        slots = self._key_slots(window)
        if isinstance(slots, slice):
            picked = (slice(None) if rows is None else rows, slice(None), slots)
            return cache_k[picked], cache_v[picked]
        slots = slots[1]   # a draft window's slots, on the device
        k, v = cache_k.index_select(2, slots), cache_v.index_select(2, slots)
        return (k, v) if rows is None else (k[rows], v[rows])

    def mask(self, window: int | None, layer: int, rows):
        """Boolean [batch, 1, tokens, keys] (True = attend), or None for plain causal."""
        key = window if self.layout.holes is None else self.layout.mask_key(window, layer)
        if key not in self._masks:
            plain = self.layout.plain(self.start, self.end, window, layer)
            slots = self._key_slots(window)
            self._masks[key] = None if plain else upload(self.layout.mask(
                self.start, self.end, window, layer,
                slots if isinstance(slots, slice) else slots[0])[:, None],
                torch.bool, self._device)
        m = self._masks[key]
        return m if m is None or rows is None else m[rows]
