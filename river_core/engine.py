"""What every layer-by-layer backend shares, so that a backend writes only numerics.

`LayerEngine` owns the cache's bookkeeping for the contract in backend.py: the layout of the
batch, positions (`offset`, `commit`, `rewind`), the slots a step writes, the prefill loop with
its prompt similarities, the multi-token verification pass, absent entries and the poisoning
of unwritten slots. A backend subclasses it and supplies:

- `new_cache(batch, capacity)`: a `KVCache` over arrays of its own kind;
- `begin(start, end)`: its per-step context for cache slots start..end-1 (rotary tables,
  masks), shared by every layer of the step;
- `embed_ids(ids)`: [batch, tokens] int64 ids to its hidden-state type `H`;
- `layer`, `stand_in_layer`, `logits`, `similarity` (the contract's), and
  `token_similarity(before, after)`: [batch, tokens] cosines, for the prompt's prior;
- `position_logits(h)`: [tokens, vocab] logits of every position of the one sequence;
- `to_numpy(array)` and `footprint()`;
- and, only as its `Capabilities` declare them: `project_kv`, `layer_span`,
  `sub_block_similarity`, `stand_in_tail`, `stand_in_logits`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .backend import Prefill, Rows
from .errors import CapabilityError
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

    def __init__(self, k: Any, v: Any, unwritten: float = float("nan")) -> None:
        self.k, self.v, self.unwritten = k, v, unwritten

    def write(self, i: int, rows: Any, start: int, end: int, k: Any, v: Any) -> None:
        """Layer i's slots start..end-1 of `rows` (None: every row; else the engine's index)."""
        rows = slice(None) if rows is None else rows
        self.k[i, rows, :, start:end] = k
        self.v[i, rows, :, start:end] = v

    def forget(self, start: int, end: int) -> None:
        """Slots start..end-1 of every layer hold nothing again."""
        self.k[:, :, :, start:end] = self.unwritten
        self.v[:, :, :, start:end] = self.unwritten

    def mark_absent(self, i: int, rows: Rows, position: int) -> None:
        rows = slice(None) if rows is None else list(rows)
        self.k[i, rows, :, position] = self.ABSENT
        self.v[i, rows, :, position] = self.ABSENT


class LayerEngine:
    """Base class of a layer-by-layer backend (see the module docstring for what it supplies).
    Its `__init__` sets the contract's attributes: name, num_layers, max_positions,
    capabilities, tokenizer, stand_in_error, runs_on."""

    num_layers: int
    layout: Layout
    cache: KVCache
    start = end = 0   # the slots the current step writes
    _offset = 0

    @property
    def offset(self) -> int:
        return self._offset

    def _start_step(self, ids: np.ndarray):
        self.start, self.end = self._offset, self._offset + ids.shape[1]
        self.begin(self.start, self.end)
        return self.embed_ids(ids)

    def prefill(self, prompts: Sequence[Sequence[int]], capacity: int,
                prefill_exit: int | None = None) -> Prefill:
        self.layout = Layout([len(p) for p in prompts], capacity, self.num_layers)
        self.cache = self.new_cache(self.layout.batch, capacity)
        self._offset = 0
        h = self._start_step(self.layout.ids(prompts))
        similarity = np.zeros((self.layout.batch, self.num_layers))
        for i in range(self.num_layers):
            deep = prefill_exit is None or i <= prefill_exit
            out = self.layer(i, h, None) if deep else self.stand_in_layer(i, h, None)
            similarity[:, i] = self.layout.prompt_mean(self.token_similarity(h, out))
            h = out
        self._offset = self.layout.width
        return Prefill(self.logits(h), similarity)

    def embed(self, tokens: Sequence[int]):
        return self._start_step(np.asarray(tokens, dtype=np.int64)[:, None])

    def commit(self) -> None:
        self._offset += 1

    def extend(self, tokens: Sequence[int]) -> np.ndarray:
        if self.layout.batch != 1:
            raise CapabilityError(f"extend runs one sequence; this cache holds "
                                  f"{self.layout.batch}")
        h = self._start_step(np.asarray([list(tokens)], dtype=np.int64))
        for i in range(self.num_layers):
            h = self.layer(i, h, None)
        self._offset += len(tokens)
        return self.position_logits(h)

    def rewind(self, offset: int) -> None:
        self.layout.rewind(offset)
        self.cache.forget(offset, self._offset)
        self._offset = offset

    def skip(self, i: int, rows: Rows) -> None:
        self.layout.skip(i, rows, self.start)
        self.cache.mark_absent(i, rows, self.start)

    def read_kv(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        n = self._offset
        return (self.to_numpy(self.cache.k[i, :, :, :n]),
                self.to_numpy(self.cache.v[i, :, :, :n]))
