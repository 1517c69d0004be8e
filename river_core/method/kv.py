"""KV strategies: the KV-sharing contract for a token that exits after layer k.

For every skipped layer j = k+1..L-1 a strategy gets the token's current state, decides what
layer j's cache holds for that token, and returns the state that continues to layer j+1 and
finally to the LM head. `river` (the method: the token runs layer j's stand-in) and
`propagate` write the slot, so every layer keeps every position; `mask` marks it absent and
later reads skip it; `monotonic` leaves it unwritten and caps how deep later tokens may run
(`ceiling`), so nobody reads it; `recompute` leaves it unwritten until the next token that
runs layer j, which first runs j for the waiting tokens.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from ..contract.backend import Backend, Pass, Rows
from ..contract.footprint import Reads
from ..settings.options import NoOptions


class KVStrategy(Protocol):
    name: str
    allows_exit: bool      # False: tokens always run the full backbone
    moves_state: bool      # True: skipped layers transform the state (the predictor observes it)
    requires: str | None   # the Capabilities flag the backend must set
    batch: bool            # False: one sequence at a time
    skipped_reads: Reads   # the weights a skipped layer reads (for bytes-per-token figures)
    drafts: bool           # can draft for speculative mode: every step writes every slot it
                           # passes and nothing carries over from step to step
    across_steps: bool     # keeps state per sequence from step to step (needs an engine with
                           # `Capabilities.sequences`)
    caps_depth: bool       # `ceiling` may cap how deep a row runs

    def layer(self, backend: Backend, p: Pass, i: int, h, deep: list[int], gone: list[int],
              batch: int, sub_blocks: bool = False):
        """Layer i of a step: the backbone for the `deep` rows, what the strategy does for the
        rows that have `gone` (of `batch`); (h, the deep rows' sub-block cosines or None)."""

    def deep_layer(self, backend: Backend, p: Pass, i: int, h, rows: Rows,
                   sub_blocks: bool = False):
        """Backbone layer i for `rows`, the tokens still in the backbone: (h, cosines)."""

    def skipped_layer(self, backend: Backend, p: Pass, i: int, h, rows: Rows): ...

    def skipped_tail(self, backend: Backend, p: Pass, start: int, h, rows: Rows):
        """Layers start..L-1 for `rows`, once every row has left and nothing watches them."""

    def ceiling(self, row: int) -> int | None:
        """The deepest backbone layer `row` may run this step (None: any)."""

    def exited(self, row: int, layer: int) -> None:
        """`row`'s token left after `layer` (the last layer: it ran full depth)."""


class Strategy:
    """Defaults: deep tokens run the backbone layer, no depth cap, batches allowed, no options.

    A strategy is made afresh for every generation, from its options."""

    batch = True
    drafts = False
    across_steps = False
    caps_depth = False

    def __init__(self, options=NoOptions()) -> None:
        self.options = options

    def layer(self, backend: Backend, p: Pass, i: int, h, deep: list[int], gone: list[int],
              batch: int, sub_blocks: bool = False):
        cosines = None
        if deep:
            h, cosines = self.deep_layer(backend, p, i, h, subset(deep, batch), sub_blocks)
        if gone:
            h = self.skipped_layer(backend, p, i, h, subset(gone, batch))
        return h, cosines

    def deep_layer(self, backend: Backend, p: Pass, i: int, h, rows: Rows,
                   sub_blocks: bool = False):
        return backend.layer(p, i, h, rows, sub_blocks)

    def skipped_tail(self, backend: Backend, p: Pass, start: int, h, rows: Rows):
        for i in range(start, backend.num_layers):
            h = self.skipped_layer(backend, p, i, h, rows)
        return h

    def ceiling(self, row: int) -> int | None:
        return None

    def exited(self, row: int, layer: int) -> None:
        pass


class River(Strategy):
    """River: stand-in j reads and writes layer j's own cache; its output feeds the head."""

    name, allows_exit, moves_state, requires = "river", True, True, "stand_in"
    skipped_reads, drafts = "stand_in", True

    def layer(self, backend: Backend, p: Pass, i: int, h, deep: list[int], gone: list[int],
              batch: int, sub_blocks: bool = False):
        if not gone:
            return backend.layer(p, i, h, None if len(deep) == batch else deep, sub_blocks)
        if not deep:
            return backend.stand_in_layer(p, i, h, None if len(gone) == batch else gone), None
        return backend.mixed_layer(p, i, h, deep, gone, sub_blocks)   # one call where it can

    def skipped_layer(self, backend: Backend, p: Pass, i: int, h, rows: Rows):
        return backend.stand_in_layer(p, i, h, rows)

    def skipped_tail(self, backend: Backend, p: Pass, start: int, h, rows: Rows):
        return backend.stand_in_tail(p, start, h, rows)


class Propagate(Strategy):
    """CALM: the exit state h_k feeds every skipped layer's K/V projection and the head."""

    name, allows_exit, moves_state, requires = "propagate", True, False, "propagate"
    skipped_reads, drafts = "kv_projection", True

    def skipped_layer(self, backend: Backend, p: Pass, i: int, h, rows: Rows):
        backend.project_kv(p, i, h, rows)
        return h


class Mask(Strategy):
    """D-LLM / SpecEE: skipped layers write no K/V, and later reads mask those entries out.

    Later tokens attend only to the entries that exist. The exit state h_k feeds the head."""

    name, allows_exit, moves_state, requires, skipped_reads = "mask", True, False, "mask", "nothing"

    def skipped_layer(self, backend: Backend, p: Pass, i: int, h, rows: Rows):
        backend.skip(p, i, rows)
        return h


class Full(Strategy):
    """No exit: every token runs the whole backbone. The baseline."""

    name, allows_exit, moves_state, requires, skipped_reads = "full", False, False, None, "nothing"
    drafts = True

    def skipped_layer(self, backend: Backend, p: Pass, i: int, h, rows: Rows):
        raise AssertionError("the full strategy never skips a layer")


class Monotonic(Strategy):
    """SkipDecode: exit depth never rises along the sequence, so no K/V entry is ever missing.

    A token never runs deeper than the token before it, so no later token needs an entry a
    skipped layer did not write. Skipped layers write nothing; h_k feeds the head."""

    name, allows_exit, moves_state, requires = "monotonic", True, False, None
    skipped_reads, across_steps, caps_depth = "nothing", True, True

    def __init__(self, options=NoOptions()) -> None:
        super().__init__(options)
        self._ceilings: dict[int, int] = {}

    def skipped_layer(self, backend: Backend, p: Pass, i: int, h, rows: Rows):
        return h

    def ceiling(self, row: int) -> int | None:
        return self._ceilings.get(row)

    def exited(self, row: int, layer: int) -> None:
        self._ceilings[row] = layer


@attrs.define
class _Waiting:
    layer: int       # the deepest backbone layer that holds its K/V
    state: object    # its output of that layer


class Recompute(Strategy):
    """EE-LLM: exited tokens' deep K/V is computed late, in one batch with the next deep token.

    A skipped layer writes nothing yet and the exit state h_k waits (and feeds the head). The
    next token to run backbone layer j runs it in one batch with every waiting token that lacks
    layer j (`layer_span`), so each deep K/V entry is exact, only late, and in place before
    anything reads it. One sequence at a time."""

    name, allows_exit, moves_state, requires = "recompute", True, False, "recompute"
    batch, skipped_reads, across_steps = False, "nothing", True

    def __init__(self, options=NoOptions()) -> None:
        super().__init__(options)
        # the positions since the last full-depth token, in order and consecutive up to the
        # step's own; their layers never rise along positions (a newer token brings older ones
        # up to its own exit), so the tokens lacking a given layer are always a suffix
        self._waiting: list[_Waiting] = []
        self._this_step_waits = False

    def deep_layer(self, backend: Backend, p: Pass, i: int, h, rows: Rows,
                   sub_blocks: bool = False):
        """Without sub-block cosines when waiting tokens ran with this one (the walk then
        observes the whole block)."""
        due = [w for w in self._waiting if w.layer < i]
        if not due:
            return backend.layer(p, i, h, rows, sub_blocks)
        *states, h = backend.layer_span(p, i, [w.state for w in due] + [h])
        for w, s in zip(due, states):
            w.layer, w.state = i, s
        if i == backend.num_layers - 1:
            self._waiting.clear()
        return h, None

    def skipped_layer(self, backend: Backend, p: Pass, i: int, h, rows: Rows):
        if not self._this_step_waits:
            self._waiting.append(_Waiting(i - 1, h))
            self._this_step_waits = True
        return h

    def exited(self, row: int, layer: int) -> None:
        self._this_step_waits = False


def subset(rows: list[int], batch: int) -> Rows:
    """`rows` of a batch of `batch`, None when that is all of them."""
    return None if len(rows) == batch else rows
