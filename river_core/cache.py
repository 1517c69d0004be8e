"""The KV cache of a layer-by-layer engine: one object owns every layer's K/V arrays, where the
batch's tokens sit (its `Layout`: padding and holes), how many positions hold tokens
(`offset`), the slots the current step writes, and trimming, as mlx-lm's caches own their
offset, update and trim.

A step reserves its slots (`begin`), writes them layer by layer (`write`, or `mark_absent` for
an entry a skipped layer leaves out on purpose) and is committed (`commit`); `trim` forgets
positions, entries and holes alike.
"""

from __future__ import annotations

from typing import Any

from .backend import Rows
from .layout import Layout


class KVCache:
    """Every layer's K and V as two [layers, batch, kv_heads, capacity, head_dim] arrays of the
    engine's kind (numpy, torch), written by index assignment.

    Slots no step wrote hold `unwritten`: NaN, so a read of one poisons whatever reads it and a
    broken strategy cannot pass for a working one; 0 only in an engine whose attention reads
    the whole capacity under a mask, where NaN would poison every row. Entries a skipped layer
    leaves out on purpose (`mask`, the layout's holes) hold ABSENT: finite, since masked
    weights are 0 and 0 * NaN would still poison the output."""

    ABSENT = 0.0

    def __init__(self, k: Any, v: Any, layout: Layout, unwritten: float = float("nan")) -> None:
        self.k, self.v, self.layout, self.unwritten = k, v, layout, unwritten
        self.offset = 0                # positions committed
        self.start = self.end = 0      # the slots the current step writes

    def begin(self, tokens: int) -> tuple[int, int]:
        """Reserve the next `tokens` slots for a step: (start, end)."""
        self.layout.positions(self.offset, self.offset + tokens)   # refuses past the capacity
        self.start, self.end = self.offset, self.offset + tokens
        return self.start, self.end

    def commit(self) -> None:
        """The step's slots hold tokens now."""
        self.offset = self.end

    def write(self, i: int, rows: Any, k: Any, v: Any, start: int | None = None,
              end: int | None = None) -> None:
        """Layer i's slots of `rows` (None: every row; else the engine's index), the step's
        unless `start`/`end` say otherwise."""
        rows = slice(None) if rows is None else rows
        start, end = self.start if start is None else start, self.end if end is None else end
        self.k[i, rows, :, start:end] = k
        self.v[i, rows, :, start:end] = v

    def mark_absent(self, i: int, rows: Rows) -> None:
        """Layer i keeps no entry for `rows` at the step's slot; later reads mask it out."""
        self.layout.skip(i, rows, self.start)
        rows = slice(None) if rows is None else list(rows)
        self.k[i, rows, :, self.start] = self.ABSENT
        self.v[i, rows, :, self.start] = self.ABSENT

    def trim(self, offset: int) -> None:
        """Forget positions offset.. (offset <= `offset`): their entries and holes."""
        self.layout.rewind(offset)
        self.k[:, :, :, offset:self.offset] = self.unwritten
        self.v[:, :, :, offset:self.offset] = self.unwritten
        self.offset = self.start = self.end = offset
