"""The engine half every layer-by-layer backend shares, written once, so that a backend
supplies only numerics.

`LayerEngine` implements the engine (`Backend`, `Verifies`), what the walk reads (`Layered`,
`StandIns` with its defaults, `MasksEntries`, `RecomputesSpans`) and measurement (`Measured`)
over one `KVCache`: the cache's shape and allocation, each step's context, which rows a layer
runs and how they go back into the batch, the last-token similarities, the prefill loop,
full-depth decoding, verification and layer spans. A backend subclasses it and supplies the
numerics its abstract methods declare (a block, the head, cosines, the step's context), and
`project_kv` where it promises `propagate`.

The host is read in one place, `host`, and only for what a decision needs: the cosines an exit
policy reads (one small read per layer it watches in a decode step, one for a whole prefill)
and the logits a token is chosen from.
"""

from __future__ import annotations

import abc
from typing import Any, Sequence

import numpy as np

from .backend import Prefill, Rows, Step
from .cache import KVCache
from .errors import CapabilityError
from .footprint import Footprint
from .layout import Layout


class StandInDefaults:
    """`StandIns`' three speed-ups done plainly: the tail layer by layer, drafts through the
    backbone's head, a mixed layer as two calls. For any engine of the walk (River inside
    vLLM too), which overrides what it can do faster."""

    num_layers: int

    def stand_in_tail(self, start: int, h, rows: Rows):
        for i in range(start, self.num_layers):
            h = self.stand_in_layer(i, h, rows)
        return h

    def stand_in_logits(self, h) -> np.ndarray:
        return self.logits(h)

    def mixed_layer(self, i: int, h, deep: list[int], gone: list[int],
                    sub_blocks: bool = False):
        h, cosines = self.layer(i, h, deep, sub_blocks)
        return self.stand_in_layer(i, h, gone), cosines


class LayerEngine(StandInDefaults, abc.ABC):
    """Base class of a layer-by-layer backend. Its subclass's `__init__` sets the contract's
    attributes: name, num_layers, max_positions, capabilities, tokenizer, runs_on,
    kv_heads and head_dim (the cache's shape), and stand_in_error where it has stand-ins."""

    kv_heads: int
    head_dim: int
    cache: KVCache | None = None
    ctx: Any = None   # the current step's context (`context`)
    # A sequence length past which the model's positional encoding changes for positions
    # already cached (Phi-3's LongRoPE switch): a step that takes a row across it recomputes
    # the cache first (`_rerun_across_the_switch`). None: never.
    rerun_at: int | None = None

    # -- what a subclass supplies ---------------------------------------------------------------

    @abc.abstractmethod
    def allocate(self, shape: tuple[int, ...]) -> tuple[Any, Any]:
        """K and V arrays of `shape` [layers, batch, kv_heads, capacity, head_dim] on the
        engine's device, every slot poisoned: NaN, so a read of a slot no step wrote poisons
        what reads it; 0 only where attention reads unwritten slots under a mask."""

    @abc.abstractmethod
    def context(self, layout: Layout, step: Step) -> Any:
        """What every layer of `step` shares (rotary tables, masks, the slots it reads),
        built once per step; it has the step's `start` and `end`."""

    @abc.abstractmethod
    def embed_ids(self, ids: np.ndarray) -> Any:
        """[batch, tokens] int64 ids to the engine's hidden states."""

    @abc.abstractmethod
    def run_block(self, i: int, x, idx, stand_in: bool, mids: list | None):
        """Layer i's block (its stand-in's with `stand_in`) on `x`, the states of rows `idx`
        (the engine's index from `row_index`, or None: every row), over the step's context
        `self.ctx`: writes layer i's slots of the step for those rows and returns their new
        states. `mids`, when given, receives the state between attention and MLP."""

    @abc.abstractmethod
    def make_index(self, rows: Sequence[int]) -> Any:
        """Rows as the engine's index (a device tensor, an array); `row_index` keeps one per
        step."""

    @abc.abstractmethod
    def scatter(self, h, idx, rows_out):
        """A copy of `h` with rows `idx` replaced by `rows_out`."""

    @abc.abstractmethod
    def concat(self, arrays: Sequence[Any], axis: int):
        """Arrays of the engine's kind joined along `axis`."""

    @abc.abstractmethod
    def cosines(self, pairs: Sequence[tuple[Any, Any]]):
        """[*a.shape[:-1], len(pairs)]: the cosine of each pair (a, b) along the hidden
        axis, on the engine's device."""

    @abc.abstractmethod
    def head(self, x, stand_in: bool = False):
        """Final norm and LM head (its stand-in's with `stand_in`) of states [..., hidden]:
        [..., vocab] on the engine's device."""

    @abc.abstractmethod
    def host(self, array) -> np.ndarray:
        """The one place a step reads the device: `array` as float numpy on the host."""

    @abc.abstractmethod
    def footprint(self) -> Footprint: ...

    # -- the engine -----------------------------------------------------------------------------

    @property
    def offset(self) -> int:
        return 0 if self.cache is None else self.cache.offset

    def _begin(self, ids: np.ndarray, step: Step):
        if self.rerun_at is not None:
            self._ids[:, step.start:step.end] = ids
            if not step.draft:
                self._rerun_across_the_switch(step)
        return self._embedded(ids, step)

    def _embedded(self, ids: np.ndarray, step: Step):
        self.cache.begin(step)
        self.ctx = self.context(self.cache.layout, step)
        self._indices: dict[tuple[int, ...], Any] = {}
        return self.embed_ids(ids)

    def _rerun_across_the_switch(self, step: Step) -> None:
        """A sequence longer than `rerun_at` has every position on the long rotary table, so
        where a step takes a row's sequence across it (up, or back down after a rejected
        verification), every row's slots up to the step's end are recomputed at full depth
        first, in one pass: the model's own result for the whole sequence, which transformers'
        Phi-3 means by dropping its cache there. Rows that do not cross keep their table (it
        is chosen per row). A draft's step skips it: verification rewrites what drafts wrote."""
        past = self.cache.layout.positions(step.start, step.end).max(-1) + 1 > self.rerun_at
        if (past == self._past_switch).all():
            return
        self._past_switch = past
        whole = Step(0, step.end)
        h = self._embedded(self._ids[:, :step.end], whole)
        for i in range(self.num_layers):
            h = self.run_block(i, h, None, False, None)

    def prefill(self, prompts: Sequence[Sequence[int]], capacity: int,
                prefill_exit: int | None = None) -> Prefill:
        layout = Layout([len(p) for p in prompts], capacity, self.num_layers)
        self.cache = KVCache(*self.allocate((self.num_layers, layout.batch, self.kv_heads,
                                             capacity, self.head_dim)), layout)
        if self.rerun_at is not None:   # what a rerun reads: every slot's id, each row's table
            self._ids = np.zeros((layout.batch, capacity), np.int64)
            self._past_switch = layout.positions(0, layout.width).max(-1) + 1 > self.rerun_at
        h = self._begin(layout.ids(prompts), Step(0, layout.width))
        cosines = []
        for i in range(self.num_layers):
            deep = prefill_exit is None or i <= prefill_exit
            out = self.run_block(i, h, None, not deep, None)
            cosines.append(self.cosines([(h, out)]))
            h = out
        every = self.host(self.concat(cosines, -1))   # [batch, tokens, layers], one read
        similarity = np.stack([layout.prompt_mean(every[..., i])
                               for i in range(self.num_layers)], -1)
        return Prefill(self.logits(h), similarity)

    def embed(self, tokens: Sequence[int], step: Step):
        return self._begin(np.asarray(tokens, dtype=np.int64)[:, None], step)

    def decode(self, tokens: Sequence[int], step: Step) -> np.ndarray:
        h = self.embed(tokens, step)
        for i in range(self.num_layers):
            h = self.run_block(i, h, None, False, None)
        return self.logits(h)

    def extend(self, tokens: Sequence[int], start: int) -> np.ndarray:
        if self.cache.layout.batch != 1:
            raise CapabilityError(f"extend runs one sequence; this cache holds "
                                  f"{self.cache.layout.batch}")
        if self.rerun_at is not None and start < self.rerun_at < start + len(tokens):
            # one pass decides a single table, but the tokens before the switch must see the
            # short one, as they do decoded one by one: two passes, split at the switch
            cut = self.rerun_at - start
            return np.concatenate([self._extend(tokens[:cut], start),
                                   self._extend(tokens[cut:], self.rerun_at)])
        return self._extend(tokens, start)

    def _extend(self, tokens: Sequence[int], start: int) -> np.ndarray:
        h = self._begin(np.asarray([list(tokens)], dtype=np.int64), Step(start, len(tokens)))
        for i in range(self.num_layers):
            h = self.run_block(i, h, None, False, None)
        return self.host(self.head(h[0]))

    def trim(self, offset: int) -> None:
        self.cache.trim(offset)

    # -- what the walk reads --------------------------------------------------------------------

    def row_index(self, rows: Sequence[int]):
        """`rows` as the engine's index, made once per step (`make_index`)."""
        key = tuple(rows)
        if key not in self._indices:
            self._indices[key] = self.make_index(rows)
        return self._indices[key]

    def _through(self, i: int, h, rows: Rows, stand_in: bool, mids: list | None = None):
        if rows is None:
            return self.run_block(i, h, None, stand_in, mids)
        idx = self.row_index(rows)
        return self.scatter(h, idx, self.run_block(i, h[idx], idx, stand_in, mids))

    def layer(self, i: int, h, rows: Rows, sub_blocks: bool = False):
        mids: list | None = [] if sub_blocks else None
        out = self._through(i, h, rows, False, mids)
        if not sub_blocks:
            return out, None
        idx = slice(None) if rows is None else self.row_index(rows)
        mid = mids[0][:, -1]
        return out, self.host(self.cosines([(h[idx, -1], mid), (mid, out[idx, -1])]))

    def stand_in_layer(self, i: int, h, rows: Rows):
        return self._through(i, h, rows, True)

    def similarity(self, before, after, rows: Rows) -> list[float]:
        idx = slice(None) if rows is None else self.row_index(rows)
        return self.host(self.cosines([(before[idx, -1], after[idx, -1])]))[:, 0].tolist()

    def logits(self, h) -> np.ndarray:
        return self.host(self.head(h[:, -1]))

    def stand_in_logits(self, h) -> np.ndarray:
        return self.host(self.head(h[:, -1], stand_in=True))

    def skip(self, i: int, rows: Rows) -> None:
        self.cache.mark_absent(i, rows, self.ctx.start)

    def layer_span(self, i: int, states):
        end = self.ctx.end
        step = self.ctx
        self.ctx = self.context(self.cache.layout, Step(end - len(states), len(states)))
        try:
            out = self.run_block(i, self.concat(states, 1), None, False, None)
        finally:
            self.ctx = step
        return [out[:, t:t + 1] for t in range(len(states))]

    # -- measurement ----------------------------------------------------------------------------

    def read_kv(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        n = self.cache.offset
        return self.host(self.cache.k[i, :, :, :n]), self.host(self.cache.v[i, :, :, :n])


class NumpyArrays:
    """`LayerEngine`'s array members for an engine whose states are numpy arrays on the host
    (ONNX Runtime's, the example backend's)."""

    def make_index(self, rows: Sequence[int]) -> np.ndarray:
        return np.asarray(rows)

    def scatter(self, h, idx, rows_out):
        full = h.copy()
        full[idx] = rows_out
        return full

    def concat(self, arrays, axis: int):
        return np.concatenate(arrays, axis=axis)

    def cosines(self, pairs) -> np.ndarray:
        return np.stack([cosine(a, b) for a, b in pairs], -1)

    def host(self, array) -> np.ndarray:
        return np.asarray(array)


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine along the last axis, in float64."""
    a, b = a.astype(np.float64), b.astype(np.float64)
    num = (a * b).sum(-1)
    return num / np.maximum(np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1), 1e-30)
