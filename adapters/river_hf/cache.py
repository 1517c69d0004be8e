"""Preallocated KV cache and the per-step context every block of one forward pass shares."""

from __future__ import annotations

from typing import Callable

import torch

ABSENT_FILL = 0.0


class KVCache:
    """K/V for every layer: [layers, batch, kv_heads, capacity, head_dim], written by index.

    Starts as NaN: a slot no layer wrote poisons whatever reads it, so a broken strategy
    cannot pass for a working one. `absent` [layers, batch, capacity] marks entries a skipped
    layer left out on purpose (`mask` strategy); they hold ABSENT_FILL and are masked from reads.
    """

    def __init__(self, layers: int, batch: int, kv_heads: int, capacity: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        shape = (layers, batch, kv_heads, capacity, head_dim)
        self.k = torch.full(shape, float("nan"), dtype=dtype, device=device)
        self.v = torch.full(shape, float("nan"), dtype=dtype, device=device)
        self.absent: torch.Tensor | None = None   # made on the first skip

    def skip(self, i: int, rows, start: int) -> None:
        if self.absent is None:
            self.absent = torch.zeros(self.k.shape[0], self.k.shape[1], self.k.shape[3],
                                      dtype=torch.bool, device=self.k.device)
        rows = slice(None) if rows is None else rows
        self.k[i, rows, :, start] = ABSENT_FILL   # finite: masked weights are 0, and 0 * NaN
        self.v[i, rows, :, start] = ABSENT_FILL   # would still poison the output
        self.absent[i, rows, start] = True

    def holes(self, i: int) -> torch.Tensor | None:
        """[batch, capacity] True where layer i has no entry, or None when it has all."""
        return None if self.absent is None else self.absent[i]


class Step:
    """Positions start..end-1 of every sequence: rotary tables, masks, cache reads and writes.

    valid: [batch, capacity] False at left padding, or None when no sequence is padded.
    Rotary tables and masks are built once per step and shared by all layers.
    """

    def __init__(self, start: int, end: int, positions: torch.Tensor,
                 valid: torch.Tensor | None, rotary: Callable) -> None:
        self.start, self.end, self.valid = start, end, valid
        self._positions, self._rotary = positions, rotary
        self._ropes: dict = {}
        self._masks: dict = {}

    def rope(self, key, rows):
        if key not in self._ropes:
            cos, sin = self._rotary(self._positions, key)
            self._ropes[key] = (cos.unsqueeze(1), sin.unsqueeze(1))
        cos, sin = self._ropes[key]
        return (cos, sin) if rows is None else (cos[rows], sin[rows])

    def _first_key(self, window: int | None) -> int:
        """Decoding reads only the last `window` slots of a sliding-window layer."""
        single = self.end - self.start == 1
        return max(0, self.end - window) if window is not None and single else 0

    def write(self, cache_k, cache_v, k, v, rows) -> None:
        if rows is None:
            cache_k[:, :, self.start:self.end] = k
            cache_v[:, :, self.start:self.end] = v
        else:
            cache_k[rows, :, self.start:self.end] = k
            cache_v[rows, :, self.start:self.end] = v

    def read(self, cache_k, cache_v, rows, window):
        lo = self._first_key(window)
        if rows is None:
            return cache_k[:, :, lo:self.end], cache_v[:, :, lo:self.end]
        return cache_k[rows, :, lo:self.end], cache_v[rows, :, lo:self.end]

    def mask(self, window: int | None, rows, holes: torch.Tensor | None = None):
        """Boolean [batch, 1, tokens, keys] (True = attend), or None for plain causal.
        holes: [batch, capacity] entries of this layer to leave out (see KVCache.absent)."""
        if window not in self._masks:
            self._masks[window] = self._build_mask(window)
        m = self._masks[window]
        m = m if m is None or rows is None else m[rows]
        if holes is None:
            return m
        lo = self._first_key(window)
        present = ~(holes if rows is None else holes[rows])[:, None, None, lo:self.end]
        return present if m is None else m & present

    def _build_mask(self, window):
        tokens, lo = self.end - self.start, self._first_key(window)
        if tokens == 1:
            return None if self.valid is None else self.valid[:, None, None, lo:self.end]
        if self.valid is None and self.start == 0 and (window is None or tokens <= window):
            return None   # plain causal: SDPA's is_causal aligns queries to the first key
        device = self._positions.device
        q = torch.arange(self.start, self.end, device=device)[:, None]
        k = torch.arange(lo, self.end, device=device)[None, :]
        m = k <= q
        if window is not None:
            m &= k > q - window
        m = m[None, None]
        if self.valid is not None:
            # a padded query attends to itself only, so softmax never sees an empty row
            m = (m & self.valid[:, None, None, lo:self.end]) | (k == q)
        return m
