"""KV strategies: the KV-sharing contract for a token that exits after layer k.

For every skipped layer j = k+1..L-1 a strategy gets the token's current state, decides what
layer j's cache holds for that token, and returns the state that continues to layer j+1 and
finally to the LM head. `river` and `propagate` write the slot, so every layer keeps every
position; `mask` marks it absent and later reads skip it; `monotonic` leaves it unwritten and
caps how deep later tokens may run (`ceiling`), so nobody reads it.
"""

from __future__ import annotations

from typing import Protocol

from .backend import Backend, Rows


class KVStrategy(Protocol):
    name: str
    allows_exit: bool      # False: tokens always run the full backbone
    moves_state: bool      # True: skipped layers transform the state (the predictor observes it)
    requires: str | None   # the Capabilities flag the backend must set

    def skipped_layer(self, backend: Backend, i: int, h, rows: Rows): ...

    def ceiling(self, row: int) -> int | None:
        """The deepest backbone layer `row` may run this step (None: any)."""

    def exited(self, row: int, layer: int) -> None:
        """`row`'s token left after `layer` (the last layer: it ran full depth)."""


class _Uncapped:
    def ceiling(self, row: int) -> int | None:
        return None

    def exited(self, row: int, layer: int) -> None:
        pass


class River(_Uncapped):
    """Stand-in layer j reads and writes layer j's own cache; its output feeds the head."""

    name, allows_exit, moves_state, requires = "river", True, True, "river"

    def skipped_layer(self, backend: Backend, i: int, h, rows: Rows):
        return backend.river_layer(i, h, rows)


class Propagate(_Uncapped):
    """CALM: the exit state h_k feeds every skipped layer's K/V projection and the head."""

    name, allows_exit, moves_state, requires = "propagate", True, False, "propagate"

    def skipped_layer(self, backend: Backend, i: int, h, rows: Rows):
        backend.project_kv(i, h, rows)
        return h


class Mask(_Uncapped):
    """D-LLM / SpecEE: skipped layers write no K/V; later tokens attend only to the entries that
    exist. The exit state h_k feeds the head."""

    name, allows_exit, moves_state, requires = "mask", True, False, "mask"

    def skipped_layer(self, backend: Backend, i: int, h, rows: Rows):
        backend.skip(i, rows)
        return h


class Full(_Uncapped):
    """No exit: every token runs the whole backbone. The baseline."""

    name, allows_exit, moves_state, requires = "full", False, False, None

    def skipped_layer(self, backend: Backend, i: int, h, rows: Rows):
        raise AssertionError("the full strategy never skips a layer")


class Monotonic:
    """SkipDecode: a token never runs deeper than the token before it, so no later token needs
    a K/V entry a skipped layer did not write. Skipped layers write nothing; h_k feeds the head."""

    name, allows_exit, moves_state, requires = "monotonic", True, False, None

    def __init__(self) -> None:
        self._ceilings: dict[int, int] = {}

    def skipped_layer(self, backend: Backend, i: int, h, rows: Rows):
        return h

    def ceiling(self, row: int) -> int | None:
        return self._ceilings.get(row)

    def exited(self, row: int, layer: int) -> None:
        self._ceilings[row] = layer
