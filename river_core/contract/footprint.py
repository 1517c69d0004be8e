"""What a decode step reads from memory: the physical speed limit is bytes per token over the
memory bandwidth. Backends report it (`Backend.footprint`); benchmarks divide."""

from __future__ import annotations

from typing import Literal

import attrs

Reads = Literal["stand_in", "kv_projection", "nothing"]
"""What a layer a token skipped reads: its stand-in, its K/V projection, or nothing."""


@attrs.frozen
class Footprint:
    """Bytes a decode step reads, weights at their stored precision: the physical speed limit
    is bytes_per_token / memory bandwidth."""

    layer_bytes: tuple[int, ...]          # per backbone layer
    stand_in_bytes: tuple[int, ...]       # per stand-in layer (0 where there is none)
    kv_projection_bytes: tuple[int, ...]  # per layer: its K and V projections alone
    head_bytes: int                       # final norm and LM head
    kv_bytes_per_position: int            # K and V of one position in one layer, as stored
    stand_in_head_bytes: int = 0          # the head's stand-in (0: none)

    def bytes_per_token(self, exit_layer: int, positions: float,
                        skipped_reads: Reads = "stand_in", stand_in_head: bool = False) -> float:
        """A token leaving after `exit_layer` with `positions` cached positions to attend.
        Only layers that attend (the backbone's and the stand-ins) read the cache. With
        `stand_in_head` a token that left reads the head's stand-in instead of the head
        (ExitConfig.exit_head; a draft's head)."""
        k, n = exit_layer, len(self.layer_bytes)
        skipped = {"stand_in": self.stand_in_bytes, "kv_projection": self.kv_projection_bytes,
                   "nothing": (0,) * n}[skipped_reads]
        attending = n if skipped_reads == "stand_in" else k + 1
        head = self.stand_in_head_bytes if stand_in_head and k < n - 1 else self.head_bytes
        return (sum(self.layer_bytes[:k + 1]) + sum(skipped[k + 1:]) + head
                + self.kv_bytes_per_position * positions * attending)
