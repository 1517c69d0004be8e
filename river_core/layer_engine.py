"""What every layer-by-layer backend shares, so that a backend writes only numerics.

`LayerEngine` keeps the cache's side of the contract in backend.py through one `KVCache`
(cache.py): the layout of the batch, positions (`offset`, `commit`, `rewind`), the slots a step
writes, the prefill loop with its prompt similarities, full-depth decoding, the multi-token
verification pass and absent entries. A backend subclasses it and supplies the numerics its
abstract methods declare, and, only as its `Capabilities` promise them, the sub-protocols'
methods (`stand_in_layer`, `project_kv`, `layer_span`, `stand_in_tail`, `stand_in_logits`).
"""

from __future__ import annotations

import abc
from typing import Any, Sequence

import numpy as np

from .backend import Prefill, Rows
from .cache import KVCache
from .errors import CapabilityError
from .footprint import Footprint
from .layout import Layout


class LayerEngine(abc.ABC):
    """Base class of a layer-by-layer backend. Its subclass's `__init__` sets the contract's
    attributes: name, num_layers, max_positions, capabilities, tokenizer, runs_on (and
    stand_in_error where it has stand-ins)."""

    num_layers: int
    cache: KVCache | None = None

    # -- what a subclass supplies ---------------------------------------------------------------

    @abc.abstractmethod
    def new_cache(self, layout: Layout) -> KVCache:
        """A cache of arrays of the engine's kind for `layout`'s batch and capacity."""

    @abc.abstractmethod
    def begin(self, start: int, end: int) -> None:
        """The engine's per-step context for cache slots start..end-1 (rotary tables, masks),
        shared by every layer of the step."""

    @abc.abstractmethod
    def embed_ids(self, ids: np.ndarray) -> Any:
        """[batch, tokens] int64 ids to the engine's hidden states."""

    @abc.abstractmethod
    def layer(self, i: int, h, rows: Rows,
              sub_blocks: bool = False) -> tuple[Any, np.ndarray | None]: ...

    @abc.abstractmethod
    def similarity(self, before, after, rows: Rows) -> list[float]: ...

    @abc.abstractmethod
    def token_similarity(self, before, after) -> np.ndarray:
        """[batch, tokens] cosines of every token before and after a layer (the prompt's
        prior)."""

    @abc.abstractmethod
    def logits(self, h) -> np.ndarray: ...

    @abc.abstractmethod
    def position_logits(self, h) -> np.ndarray:
        """[tokens, vocab] logits of every position of the one sequence."""

    @abc.abstractmethod
    def to_numpy(self, array) -> np.ndarray: ...

    @abc.abstractmethod
    def footprint(self) -> Footprint: ...

    # -- the contract's bookkeeping -------------------------------------------------------------

    @property
    def offset(self) -> int:
        return 0 if self.cache is None else self.cache.offset

    def _start_step(self, ids: np.ndarray):
        self.begin(*self.cache.begin(ids.shape[1]))
        return self.embed_ids(ids)

    def prefill(self, prompts: Sequence[Sequence[int]], capacity: int,
                prefill_exit: int | None = None) -> Prefill:
        layout = Layout([len(p) for p in prompts], capacity, self.num_layers)
        self.cache = self.new_cache(layout)
        h = self._start_step(layout.ids(prompts))
        similarity = np.zeros((layout.batch, self.num_layers))
        for i in range(self.num_layers):
            deep = prefill_exit is None or i <= prefill_exit
            out = self.layer(i, h, None)[0] if deep else self.stand_in_layer(i, h, None)
            similarity[:, i] = layout.prompt_mean(self.token_similarity(h, out))
            h = out
        self.cache.commit()
        return Prefill(self.logits(h), similarity)

    def embed(self, tokens: Sequence[int]):
        return self._start_step(np.asarray(tokens, dtype=np.int64)[:, None])

    def decode(self, tokens: Sequence[int]) -> np.ndarray:
        h = self.embed(tokens)
        for i in range(self.num_layers):
            h = self.layer(i, h, None)[0]
        return self.logits(h)

    def commit(self) -> None:
        self.cache.commit()

    def extend(self, tokens: Sequence[int]) -> np.ndarray:
        if self.cache.layout.batch != 1:
            raise CapabilityError(f"extend runs one sequence; this cache holds "
                                  f"{self.cache.layout.batch}")
        h = self._start_step(np.asarray([list(tokens)], dtype=np.int64))
        for i in range(self.num_layers):
            h = self.layer(i, h, None)[0]
        self.cache.commit()
        return self.position_logits(h)

    def rewind(self, offset: int) -> None:
        self.cache.trim(offset)

    def skip(self, i: int, rows: Rows) -> None:
        self.cache.mark_absent(i, rows)

    def read_kv(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        n = self.cache.offset
        return (self.to_numpy(self.cache.k[i, :, :, :n]),
                self.to_numpy(self.cache.v[i, :, :, :n]))
