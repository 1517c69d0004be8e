"""LongRoPE's switch: past a sequence length the model's rotary changes for positions
already cached, so a step that takes a row across it recomputes the cache first. The rotary
tables themselves are the engine's; this object only decides when a step crosses and keeps the
ids a recompute reads. A layer engine of such a model composes one per generation
(`LayerEngine.switch_at`)."""

from __future__ import annotations

import numpy as np

from .backend import Step
from .layout import Layout


class RotarySwitch:
    """Every slot's id and each row's table, for one generation's cache."""

    def __init__(self, at: int, layout: Layout) -> None:
        self.at = at
        self._layout = layout
        self.ids = np.zeros((layout.batch, layout.capacity), np.int64)
        self._past = self._past_at(Step(0, layout.width))

    def after_prompts(self) -> "RotarySwitch":
        """The switch as the prefill left it (the prompts' ids, their table): for steps run
        again over a kept prefill (`LayerEngine.kept_prefill`)."""
        fresh = RotarySwitch(self.at, self._layout)
        width = self._layout.width
        fresh.ids[:, :width] = self.ids[:, :width]
        return fresh

    def _past_at(self, step: Step) -> np.ndarray:
        return self._layout.positions(step.start, step.end).max(-1) + 1 > self.at

    def crossing(self, ids: np.ndarray, step: Step) -> Step | None:
        """Records `step`'s ids; where the step takes a row's sequence across the switch (up,
        or back down after a rejected verification), the step of every slot up to its end,
        which the engine then recomputes at full depth first, in one pass: the model's own
        result for the whole sequence, which transformers means by dropping its cache
        there. Rows that do not cross keep their table (it is chosen per row). A draft's step
        never crosses: verification rewrites what drafts wrote."""
        self.ids[:, step.start:step.end] = ids
        if step.draft:
            return None
        past = self._past_at(step)
        if (past == self._past).all():
            return None
        self._past = past
        return Step(0, step.end)

    def parts(self, start: int, tokens: int) -> list[tuple[int, int]]:
        """A verification of `tokens` at `start` as (start, tokens) passes: one pass decides a
        single table, but the tokens before the switch must see the short one, as they do
        decoded one by one, so two passes where it spans the switch."""
        if start < self.at < start + tokens:
            return [(start, self.at - start), (self.at, start + tokens - self.at)]
        return [(start, tokens)]
