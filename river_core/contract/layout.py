"""Where a batch's tokens sit in the cache, computed once for every engine (numpy).

Prompts of different lengths are left-padded to one width, so position p of the cache holds
token p - pad[r] of row r. Padding is never attended. A layer may also hold *holes*: entries a
skipped layer left out on purpose (the `mask` strategy), never attended either. Engines convert
the boolean masks below into their own form (a torch bool mask, an additive float mask).
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from .backend import Step
from ..settings.errors import ConfigError

SINKS = 4   # a draft window's first slots, which attention leans on (attention sinks)


def window_slots(lo: int, end: int, draft_window: int | None) -> slice | np.ndarray:
    """Of slots lo..end-1, those a draft under `draft_window` reads: the ones among the first
    SINKS and the last `draft_window` (all of them, as a slice, where that is all)."""
    recent = lo if draft_window is None else end - draft_window
    if recent <= max(lo, SINKS):
        return slice(lo, end)
    return np.r_[lo:max(lo, SINKS), recent:end]


@attrs.frozen(eq=False)
class View:
    """A step's place in the cache as plain numpy arrays, built once per step
    (`Layout.view`), which an engine converts once into its own kind (its `Pass`). Per-layer
    fields hold one entry per layer; layers of one attention window share one object."""

    step: Step
    positions: np.ndarray   # [batch, tokens] rotary positions of the step's slots
    slots: tuple            # per layer: the key slots its queries read (a slice or int array)
    masks: tuple            # per layer: [batch, tokens, keys] bool over those slots, True where
                            # a query attends
    plain: tuple            # per layer: its mask is plain causal attention from slot 0 (or
                            # every key for a single query), which an engine may skip

    def converted_masks(self, convert) -> list:
        """Each layer's mask as `convert` makes it, each distinct mask converted once (the
        layers of one attention window share one)."""
        made: dict = {}
        return [made[id(m)] if id(m) in made else made.setdefault(id(m), convert(m))
                for m in self.masks]


class Layout:
    def __init__(self, lengths: Sequence[int], capacity: int, num_layers: int) -> None:
        self.width = max(lengths)
        self.capacity = capacity
        self.pad = np.array([self.width - n for n in lengths], dtype=np.int64)
        self.valid = np.arange(capacity)[None, :] >= self.pad[:, None]   # [batch, capacity]
        self.padded = bool(self.pad.any())
        self._num_layers = num_layers
        self.holes: np.ndarray | None = None   # [layers, batch, capacity], made on first skip

    @property
    def batch(self) -> int:
        return len(self.pad)

    def ids(self, prompts: Sequence[Sequence[int]]) -> np.ndarray:
        """[batch, width] int64: the prompts left-padded with 0."""
        out = np.zeros((self.batch, self.width), dtype=np.int64)
        for r, p in enumerate(prompts):
            out[r, self.width - len(p):] = p
        return out

    def positions(self, start: int, end: int) -> np.ndarray:
        """[batch, end - start] rotary positions of cache slots start..end-1."""
        return np.maximum(np.arange(start, end)[None, :] - self.pad[:, None], 0)

    def view(self, step: Step, windows: Sequence[int | None],
             windowed_reads: bool = True) -> View:
        """Step `step` for layers of attention `windows`: the slots each reads (with
        `windowed_reads` False every slot before the step's end, a draft window's apart, and
        the mask keeps the layer's window), its mask over them, and whether that is plain."""
        start, end = step.start, step.end
        # a mask depends on its window, and on its layer once any layer has holes
        holes = self.holes is not None
        made: dict = {}
        slots, masks, plain = [], [], []
        for i, window in enumerate(windows):
            key = (window, i if holes else None)
            if key not in made:
                s = self.key_slots(start, end, window if windowed_reads else None,
                                   step.draft_window)
                made[key] = (s, self.mask(start, end, window, i, s),
                             windowed_reads and self.plain(start, end, window, i))
            s, m, p = made[key]
            slots.append(s)
            masks.append(m)
            plain.append(p)
        return View(step, self.positions(start, end), tuple(slots), tuple(masks), tuple(plain))

    def prompt_mean(self, values: np.ndarray) -> np.ndarray:
        """[batch, width] per-token values -> [batch] mean over each prompt's real tokens."""
        valid = self.valid[:, :self.width]
        return (values * valid).sum(1) / valid.sum(1)

    def skip(self, layer: int, rows: Sequence[int] | None, position: int) -> None:
        """Layer `layer` keeps no entry for `rows` at `position`."""
        if self.holes is None:
            self.holes = np.zeros((self._num_layers, self.batch, self.capacity), dtype=bool)
        self.holes[layer, slice(None) if rows is None else list(rows), position] = True

    def begin(self, start: int, end: int) -> None:
        """A step writes slots start..end-1: refused past the capacity, and whatever holes an
        earlier step left there (a rejected draft's) are gone."""
        if end > self.capacity:
            raise ConfigError(f"the cache is full: slots {start}..{end - 1} do not fit its "
                              f"{self.capacity} (the capacity prefill was given)")
        if self.holes is not None:
            self.holes[:, :, start:end] = False

    def first_key(self, start: int, end: int, window: int | None) -> int:
        """The first slot a step of queries start..end-1 can attend: a single decoding query
        of a sliding-window layer reads only the last `window` slots."""
        return max(0, end - window) if window is not None and end - start == 1 else 0

    def key_slots(self, start: int, end: int, window: int | None,
                  draft_window: int | None = None) -> slice | np.ndarray:
        """The slots a step's queries read: first_key..end-1; for a single query under a
        draft window (ExitConfig.draft_window) only those of them among the first SINKS
        slots and the last `draft_window`."""
        lo = self.first_key(start, end, window)
        return window_slots(lo, end, draft_window if end - start == 1 else None)

    def _holes(self, layer: int, slots: slice | np.ndarray) -> np.ndarray | None:
        holes = None if self.holes is None else self.holes[layer][:, slots]
        return holes if holes is not None and holes.any() else None

    def plain(self, start: int, end: int, window: int | None, layer: int) -> bool:
        """True when `mask` is all-causal attention with the queries starting at slot 0, or
        every key for a single query: an engine may then skip the mask."""
        slots = slice(self.first_key(start, end, window), end)
        return not self.padded and self._holes(layer, slots) is None and \
            (end - start == 1 or (start == 0 and (window is None or end <= window)))

    def mask(self, start: int, end: int, window: int | None, layer: int,
             slots: slice | np.ndarray | None = None) -> np.ndarray:
        """[batch, queries, keys] True where query slot start..end-1 attends key slot `slots`
        (by default first_key..end-1) of layer `layer`."""
        slots = slice(self.first_key(start, end, window), end) if slots is None else slots
        q = np.arange(start, end)[:, None]
        k = np.arange(end)[slots][None, :]
        m = k <= q
        if window is not None:
            m = m & (k > q - window)
        m = m[None] & self.valid[:, None, slots]
        holes = self._holes(layer, slots)
        if holes is not None:
            m = m & ~holes[:, None]
        return m | (k == q)[None]   # a padded query attends to itself, so no row is empty
