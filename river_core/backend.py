"""The backend contract: the primitives a backend supplies. The decode loop lives in the core.

A backend owns the model weights, its KV cache and an opaque hidden-state type `H` (a torch
tensor, a numpy array...). The core never looks inside `H`; it only passes it back.

Cache model. Every layer has one K/V slot per position. `prefill` fills positions
0..T-1 of every layer. Each decode step then writes exactly one new position, the same one in
every layer, at index `offset`; `commit()` advances `offset`. Between `embed` and `commit` the
core calls, for every layer i in order, exactly one of:

- `layer(i, h, rows)`: the backbone layer; writes layer i's slot for those rows;
- `stand_in_layer(i, h, rows)`: layer i's stand-in (its weight-quantized copy); reads layer
  i's cache like the backbone and writes layer i's slot itself (the cache is shared, never
  copied);
- `project_kv(i, h, rows)`: writes layer i's K/V computed from `h` without running the layer;
- `skip(i, rows)`: writes nothing: layer i has no entry for this position, and every later
  read of layer i masks it out (only for the `mask` strategy);
- `layer_span(i, states, start)`: the backbone layer over positions start..offset of a single
  sequence at once, causally, writing all their slots: earlier tokens whose layer-i entry was
  left unwritten, then this step's token (only for the `recompute` strategy, which guarantees
  that no read of those slots happens before).

Outside that per-token protocol, for speculative decoding (one sequence only):

- `extend(tokens)`: the backbone over the next len(tokens) positions at once, causally, at full
  depth: writes every layer's slots offset..offset+m-1, advances `offset` by m and returns the
  logits of every position;
- `rewind(offset)`: forgets every position from `offset` on; the next write lands there.

So after any sequence of exits every layer holds the same number of positions (some of them
marked absent under `mask`, some not yet written under `recompute`).

`rows` selects batch rows (a sorted list of row indices) or None for all of them. Layer
calls return a new `H` of the full batch in which only `rows` changed.

Padding, rotary positions, attention windows and holes are the same for every engine: a backend
takes them from `river_core.layout.Layout` rather than computing its own. A layer-by-layer
engine need not write the bookkeeping above: `river_core.engine.LayerEngine` implements
offset, prefill, embed, commit, extend, rewind, skip and read_kv, and asks only for numerics.
"""

from __future__ import annotations

from typing import Generic, Protocol, Sequence, TypeVar, runtime_checkable

import attrs
import numpy as np

from .footprint import Footprint

H = TypeVar("H")
Rows = Sequence[int] | None


@attrs.frozen
class Capabilities:
    """What a backend can do, beyond full-depth decoding of one sequence: nothing is claimed
    unless a backend says so. The core refuses anything not declared here with a clear
    error."""

    exits: bool = False       # can stop a token part-way through the backbone
    stand_in: bool = False    # has `stand_in_layer`
    propagate: bool = False   # has `project_kv`
    mask: bool = False        # has `skip`: absent entries, masked from later reads
    recompute: bool = False   # has `layer_span`: late K/V for earlier tokens, batch 1
    sub_blocks: bool = False  # has `sub_block_similarity`
    stand_in_tail: bool = False   # has `stand_in_tail`: a token's whole exit river in one call
    verify: bool = False      # has `extend` and `rewind`: speculative decoding, batch 1
    stand_in_head: bool = False   # has `stand_in_logits`: the LM head at stand-in precision
    batch: bool = False       # accepts more than one sequence
    devices: tuple[str, ...] = ("cpu",)


@attrs.frozen
class ModelShape:
    """What a plan needs to know of a model: its depth and its context in positions."""

    num_layers: int
    max_positions: int


@attrs.frozen
class Prefill:
    """Result of running prompts at full depth.

    logits: [batch, vocab] float32 at each prompt's last position.
    similarity: [batch, layers] mean cosine between each layer's input and output over the
    prompt's tokens: the predictor's prior for how much each block moves the state.
    """

    logits: np.ndarray
    similarity: np.ndarray


class Tokenizer(Protocol):
    eos_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat(self, prompt: str) -> list[int]:
        """Token ids of `prompt` as one user turn under the model's chat template."""


@runtime_checkable
class Backend(Protocol, Generic[H]):
    name: str
    num_layers: int
    max_positions: int
    capabilities: Capabilities
    tokenizer: Tokenizer
    stand_in_error: Sequence[float]
    """Per layer: relative weight error of its stand-in, ||Q(W) - W|| / ||W|| over the layer's
    projections. The predictor scales its KV-error estimate by it."""
    runs_on: tuple[str, ...]
    """Where the backend really computes: devices or execution providers, as the engine
    reports them (e.g. ("cpu",), ("CPUExecutionProvider",))."""

    @property
    def offset(self) -> int:
        """Positions written so far (the same in every layer)."""

    def prefill(self, prompts: Sequence[Sequence[int]], capacity: int,
                prefill_exit: int | None = None) -> Prefill:
        """Reset the cache to room for `capacity` positions and run `prompts` through every
        layer: the backbone's up to `prefill_exit` (None: all), the stand-ins' past it (the
        sequence-level exit of prefill; only with `Capabilities.stand_in`).

        Shorter prompts are left-padded; padding is masked from attention everywhere."""

    def embed(self, tokens: Sequence[int]) -> H: ...

    def layer(self, i: int, h: H, rows: Rows) -> H: ...

    def stand_in_layer(self, i: int, h: H, rows: Rows) -> H: ...

    def stand_in_tail(self, start: int, h: H, rows: Rows) -> H:
        """The stand-ins of layers start..L-1 in turn, as one call where the engine can fuse
        them (the same result as `stand_in_layer` for each; any start must work)."""

    def project_kv(self, i: int, h: H, rows: Rows) -> None: ...

    def extend(self, tokens: Sequence[int]) -> np.ndarray:
        """Run `tokens` through the whole backbone at positions offset.. of the one sequence,
        write their slots in every layer and commit them: [len(tokens), vocab] float32 logits,
        row t predicting the token after tokens[t] (only with `Capabilities.verify`)."""

    def rewind(self, offset: int) -> None:
        """Forget positions offset.. (offset <= `offset` now): later steps overwrite them."""

    def skip(self, i: int, rows: Rows) -> None: ...

    def layer_span(self, i: int, states: Sequence[H], start: int) -> list[H]:
        """Layer i for positions start..offset of the one sequence: `states` holds one
        single-token state per position, in order; returns their outputs likewise."""

    def similarity(self, before: H, after: H, rows: Rows) -> list[float]:
        """Cosine of each selected row's state before and after a layer."""

    def sub_block_similarity(self, rows: Rows) -> list[tuple[float, float]]:
        """For the latest `layer` call: per selected row, the cosine between the last token's
        state before and after the attention sub-block, and before and after the MLP
        sub-block (only with `Capabilities.sub_blocks`)."""

    def logits(self, h: H) -> np.ndarray:
        """Final norm and LM head: [batch, vocab] float32."""

    def stand_in_logits(self, h: H) -> np.ndarray:
        """`logits` with the head's stand-in (its weight-quantized copy): for drafts, whose
        logits only pick a token the backbone then checks (`Capabilities.stand_in_head`)."""

    def commit(self) -> None:
        """Advance `offset` past the position this step wrote."""

    def footprint(self) -> Footprint:
        """What a decode step reads from memory, for speed limits in benchmarks."""

    def read_kv(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer i's keys and values for positions 0..offset-1: two [batch, kv_heads, offset,
        head_dim] float32 arrays. For tests and measurements, not the hot path."""
