"""The engine half every layer-by-layer backend shares, written once, so that a backend
supplies only numerics.

`LayerEngine` implements the engine (`Backend`, `Verifies`), what the walk reads (`Layered`,
`StandIns` with its defaults, `MasksEntries`, `RecomputesSpans`) and measurement (`Measured`)
over one `KVCache`: the cache's shape and allocation, each step's `Pass` (made once per step
from the layout's `View`, handed to every call of the step: the engine keeps no per-step
state), which rows a layer runs and how they go back into the batch, the last-token
similarities, the prefill loop, full-depth decoding, verification and layer spans. A backend
subclasses it, mixes in its array members (`NumpyArrays`, or river_compute.torch_blocks'
`TorchArrays`) and supplies the numerics its abstract methods declare (`allocate`, the pass's
tensors, the embedding, a block, the head, its footprint), and `project_kv` where it promises
`propagate`.

The host is read in one place, `host`, and only for what a decision needs: the cosines an exit
policy reads (one small read per layer it watches in a decode step, one for a whole prefill)
and the logits a token is chosen from.
"""

from __future__ import annotations

import abc
from typing import Any, Callable, Sequence

import numpy as np

from .backend import Pass, Prefill, Rows, Step
from .cache import KVCache
from ..settings.errors import CapabilityError
from .footprint import Footprint
from .layout import Layout, View
from .switch import RotarySwitch


class StandInDefaults:
    """`StandIns`' three speed-ups done plainly: the tail layer by layer, drafts through the
    backbone's head, a mixed layer as two calls. For any engine of the walk (River inside
    vLLM too), which overrides what it can do faster."""

    num_layers: int

    def stand_in_tail(self, p, start: int, h, rows: Rows):
        for i in range(start, self.num_layers):
            h = self.stand_in_layer(p, i, h, rows)
        return h

    def stand_in_logits(self, h) -> np.ndarray:
        return self.logits(h)

    def mixed_layer(self, p, i: int, h, deep: list[int], gone: list[int],
                    sub_blocks: bool = False):
        h, cosines = self.layer(p, i, h, deep, sub_blocks)
        return self.stand_in_layer(p, i, h, gone), cosines


class LayerEngine(StandInDefaults, abc.ABC):
    """Base class of a layer-by-layer backend. Its subclass's `__init__` sets the contract's
    attributes: name, num_layers, max_positions, capabilities, tokenizer, runs_on,
    kv_heads and head_dim (the cache's shape), windows (each layer's attention window), and
    stand_in_error where it has stand-ins; an engine whose arrays are not numpy's mixes in its
    array members (`NumpyArrays`, river_compute.torch_blocks' `TorchArrays`)."""

    kv_heads: int
    head_dim: int
    windows: Sequence[int | None]
    # False: every layer's queries read every slot before the step's end (a draft window's
    # apart) and the mask keeps a sliding window (`Layout.view`)
    windowed_reads = True
    # The sequence length of the model's LongRoPE switch (`RotarySwitch`), or None.
    switch_at: int | None = None
    # The most prompt tokens a prefill pass takes (None: the whole prompt in one pass).
    prefill_chunk: int | None = None
    # Whether a full-depth pass of up to `exact_width` tokens computes each token bitwise as
    # a pass of that token alone does (no kernel of it takes its summation order from the
    # pass's width): a verification then runs as one pass. Otherwise, or wider, it runs a
    # pass a token: exact by construction (`Verifies.extend`), and as slow as that many steps.
    exact_width = 1
    cache: KVCache | None = None
    switch: RotarySwitch | None = None
    # the last prefill: its cache, prompts, prefill_exit and result (`kept_prefill`)
    _kept: tuple[KVCache, list[list[int]], int | None, Prefill] | None = None

    # -- what a subclass supplies ---------------------------------------------------------------

    @abc.abstractmethod
    def allocate(self, shape: tuple[int, ...]) -> tuple[Any, Any]:
        """K and V arrays of `shape` [layers, batch, kv_heads, capacity, head_dim] on the
        engine's device, every slot poisoned: NaN, so a read of a slot no step wrote poisons
        what reads it; 0 only where attention reads unwritten slots under a mask."""

    @abc.abstractmethod
    def make_pass(self, view: View, ids: np.ndarray | None) -> Pass:
        """The step's `Pass`: `view`'s arrays (and the rotary tables of its positions, each
        layer's) converted once into the engine's kind, with `ids` ([batch, tokens] int64)."""

    @abc.abstractmethod
    def embed_ids(self, ids: np.ndarray) -> Any:
        """[batch, tokens] int64 ids to the engine's hidden states."""

    @abc.abstractmethod
    def run_block(self, p: Pass, i: int, x, idx, stand_in: bool, mids: list | None):
        """Layer i's block (its stand-in's with `stand_in`) in pass `p` on `x`, the states of
        rows `idx` (the engine's index from `Pass.index`, or None: every row): writes layer i's
        slots of the step for those rows and returns their new states. `mids`, when given,
        receives the state between attention and MLP."""

    @abc.abstractmethod
    def head(self, x, stand_in: bool = False):
        """Final norm and LM head (its stand-in's with `stand_in`) of states [..., hidden]:
        [..., vocab] on the engine's device."""

    @abc.abstractmethod
    def footprint(self) -> Footprint: ...

    # the array members (`NumpyArrays`, `TorchArrays`): rows as the engine's index, a copy of
    # `h` with rows `idx` replaced, arrays joined along an axis, the cosines of pairs along the
    # hidden axis ([*a.shape[:-1], len(pairs)], on the engine's device), and the one place a
    # step reads the device (`host`: float numpy)
    make_index: Callable[[Sequence[int]], Any]
    scatter: Callable[[Any, Any, Any], Any]
    concat: Callable[[Sequence[Any], int], Any]
    cosines: Callable[[Sequence[tuple[Any, Any]]], Any]
    host: Callable[[Any], np.ndarray]

    # -- the engine -----------------------------------------------------------------------------

    @property
    def offset(self) -> int:
        return 0 if self.cache is None else self.cache.offset

    def _begin(self, ids: np.ndarray, step: Step) -> Pass:
        if self.switch is not None:
            whole = self.switch.crossing(ids, step)
            if whole is not None:   # the prompts' slots too: a kept prefill holds them no more
                self._kept = None
                self._full_depth(self._pass(self.switch.ids[:, :whole.end], whole))
        return self._pass(ids, step)

    def _pass(self, ids: np.ndarray | None, step: Step, starts: bool = True) -> Pass:
        if starts:
            self.cache.begin(step)
        return self.make_pass(self.cache.layout.view(step, self.windows, self.windowed_reads),
                              ids)

    def _full_depth(self, p: Pass):
        h = self.embed_ids(p.ids)
        for i in range(self.num_layers):
            h = self.run_block(p, i, h, None, False, None)
        return h

    def prefill(self, prompts: Sequence[Sequence[int]], capacity: int,
                prefill_exit: int | None = None) -> Prefill:
        layout = Layout([len(p) for p in prompts], capacity, self.num_layers)
        self.cache = KVCache(*self.allocate((self.num_layers, layout.batch, self.kv_heads,
                                             capacity, self.head_dim)), layout)
        self.switch = None if self.switch_at is None else RotarySwitch(self.switch_at, layout)
        ids = layout.ids(prompts)
        # in chunks where the engine asks (its widest graph bounds its memory), but one pass
        # under a rotary switch, whose table is chosen by the pass's last position
        chunk = layout.width if self.prefill_chunk is None or self.switch is not None \
            else self.prefill_chunk
        every = []   # [batch, tokens, layers] per chunk
        for start in range(0, layout.width, chunk):
            tokens = min(chunk, layout.width - start)
            h, cosines = self.prefill_layers(self._begin(ids[:, start:start + tokens],
                                                         Step(start, tokens)), prefill_exit)
            every.append(cosines)
        every = np.concatenate(every, 1)
        similarity = np.stack([layout.prompt_mean(every[..., i])
                               for i in range(self.num_layers)], -1)
        result = Prefill(self.logits(h), similarity)
        self._kept = (self.cache, [list(map(int, p)) for p in prompts], prefill_exit, result)
        return result

    def kept_prefill(self, prompts: Sequence[Sequence[int]], capacity: int,
                     prefill_exit: int | None = None) -> Prefill | None:
        kept = self._kept
        if kept is None or kept[0] is not self.cache:
            return None
        cache, prompts_kept, exit_kept, result = kept
        if exit_kept != prefill_exit or capacity != cache.layout.capacity or \
                prompts_kept != [list(map(int, p)) for p in prompts]:
            return None
        cache.trim(cache.layout.width)
        if self.switch is not None:
            self.switch = self.switch.after_prompts()
        return result

    def prefill_layers(self, p: Pass, prefill_exit: int | None) -> tuple[Any, np.ndarray]:
        """A prefill pass through every layer (stand-ins past `prefill_exit`, the paper's
        sequence-level exit): the last layer's states and each layer's cosine of its input
        and output per token, [batch, tokens, layers] on the host (read once)."""
        h = self.embed_ids(p.ids)
        cosines = []
        for i in range(self.num_layers):
            deep = prefill_exit is None or i <= prefill_exit
            out = self.run_block(p, i, h, None, not deep, None)
            cosines.append(self.cosines([(h, out)]))
            h = out
        return h, self.host(self.concat(cosines, -1))

    def begin(self, tokens: Sequence[int], step: Step) -> Pass:
        return self._begin(np.asarray(tokens, dtype=np.int64)[:, None], step)

    def embed(self, p: Pass):
        return self.embed_ids(p.ids)

    def decode(self, tokens: Sequence[int], step: Step) -> np.ndarray:
        return self.full_depth_logits(self.begin(tokens, step), every_token=False)

    def full_depth_logits(self, p: Pass, every_token: bool) -> np.ndarray:
        """The whole backbone and the head on the host: logits [batch, vocab] of each row's
        last token, or [batch, tokens, vocab] of every token. An engine that can runs it as
        one call."""
        h = self._full_depth(p)
        return self.host(self.head(h)) if every_token else self.logits(h)

    def extend(self, tokens: Sequence[int], start: int) -> np.ndarray:
        if self.cache.layout.batch != 1:
            raise CapabilityError(f"extend runs one sequence; this cache holds "
                                  f"{self.cache.layout.batch}")
        parts = [(start, len(tokens))] if self.switch is None else \
            self.switch.parts(start, len(tokens))
        return np.concatenate([self._extend(tokens[at - start:at - start + n], at)
                               for at, n in parts])

    def _extend(self, tokens: Sequence[int], start: int) -> np.ndarray:
        width = self.exact_width
        if len(tokens) == 1:   # a decode step's own pass
            return self.decode(tokens, Step(start))
        if len(tokens) <= width:   # one pass, as the engine runs it whole
            return self.full_depth_logits(self._verify_pass(tokens, start), every_token=True)[0]
        # a pass a `width` tokens, each exact as steps; their logits read from the device once
        return self.host(self.concat([self._exact_logits(tokens[at:at + width], start + at)
                                      for at in range(0, len(tokens), width)], 0))

    def _verify_pass(self, tokens: Sequence[int], start: int) -> Pass:
        return self._begin(np.asarray([list(tokens)], dtype=np.int64), Step(start, len(tokens)))

    def _exact_logits(self, tokens: Sequence[int], start: int):
        """Logits [len(tokens), vocab] on the device of at most `exact_width` tokens at slots
        start..: one token as a decode step computes it (the head of its last state)."""
        h = self._full_depth(self._verify_pass(tokens, start))
        return self.head(h[:, -1]) if len(tokens) == 1 else self.head(h)[0]

    def trim(self, offset: int) -> None:
        self.cache.trim(offset)

    # -- what the walk reads --------------------------------------------------------------------

    def layer(self, p: Pass, i: int, h, rows: Rows, sub_blocks: bool = False):
        mids: list | None = [] if sub_blocks else None
        if rows is None:   # `_through`, inline: the walk's every backbone layer
            idx, out = slice(None), self.run_block(p, i, h, None, False, mids)
        else:
            idx = p.index(rows, self.make_index)
            out = self.scatter(h, idx, self.run_block(p, i, h[idx], idx, False, mids))
        if not sub_blocks:
            return out, None
        mid = mids[0][:, -1]
        return out, self.host(self.cosines([(h[idx, -1], mid), (mid, out[idx, -1])]))

    def stand_in_layer(self, p: Pass, i: int, h, rows: Rows):
        if rows is None:
            return self.run_block(p, i, h, None, True, None)
        idx = p.index(rows, self.make_index)
        return self.scatter(h, idx, self.run_block(p, i, h[idx], idx, True, None))

    def similarity(self, p: Pass, before, after, rows: Rows) -> list[float]:
        idx = slice(None) if rows is None else p.index(rows, self.make_index)
        return self.host(self.cosines([(before[idx, -1], after[idx, -1])]))[:, 0].tolist()

    def logits(self, h) -> np.ndarray:
        return self.host(self.head(h[:, -1]))

    def stand_in_logits(self, h) -> np.ndarray:
        return self.host(self.head(h[:, -1], stand_in=True))

    def skip(self, p: Pass, i: int, rows: Rows) -> None:
        self.cache.mark_absent(i, rows, p.step.start)

    def layer_span(self, p: Pass, i: int, states):
        span = self._pass(None, Step(p.step.end - len(states), len(states)), starts=False)
        out = self.run_block(span, i, self.concat(states, 1), None, False, None)
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
