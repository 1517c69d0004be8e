"""The KV cache of a layer-by-layer engine: one object owns every layer's K/V arrays, where the
batch's tokens sit (its `Layout`: padding and holes) and how many positions hold tokens
(`offset`), as mlx-lm's caches own their offset, update and trim.

No cursor: each step names its slots (`river_core.contract.backend.Step`), `write` assigns them by
index, and `trim` moves the offset, nothing else. Slots are poisoned once, at allocation
(`LayerEngine.allocate`), so a read of one no step wrote shows; a slot a rejected draft left
is never read again, because every step attends only slots before its own end, and the next
step there overwrites it.
"""

from __future__ import annotations

from typing import Any

from .backend import Rows, Step
from .layout import Layout


class KVCache:
    """Every layer's K and V as two [layers, batch, kv_heads, capacity, head_dim] arrays of the
    engine's kind (numpy, torch, or what indexes like them: per-layer device buffers), written
    by index assignment. Entries a skipped layer leaves out on purpose (`mask`, the layout's
    holes) hold ABSENT: finite, since masked weights are 0 and 0 * NaN would still poison the
    output."""

    ABSENT = 0.0

    def __init__(self, k: Any, v: Any, layout: Layout) -> None:
        self.k, self.v, self.layout = k, v, layout
        self.offset = 0   # positions holding tokens

    def begin(self, step: Step) -> None:
        """A step writes `step`'s slots: they hold its tokens from now on."""
        self.layout.begin(step.start, step.end)   # refuses past the capacity
        self.offset = step.end

    def write(self, i: int, rows: Any, k: Any, v: Any, start: int, end: int) -> None:
        """Layer i's slots start..end-1 of `rows` (None: every row; else the engine's index)."""
        rows = slice(None) if rows is None else rows
        self.k[i, rows, :, start:end] = k
        self.v[i, rows, :, start:end] = v

    def mark_absent(self, i: int, rows: Rows, position: int) -> None:
        """Layer i keeps no entry for `rows` at `position`; later reads mask it out."""
        self.layout.skip(i, rows, position)
        rows = slice(None) if rows is None else list(rows)
        self.k[i, rows, :, position] = self.ABSENT
        self.v[i, rows, :, position] = self.ABSENT

    def trim(self, offset: int) -> None:
        """Positions offset.. hold no tokens any more."""
        self.offset = min(self.offset, offset)
