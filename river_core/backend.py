"""The backend contract: what an engine supplies. The decode loop and every exit decision live
in the core (decode.py); a backend supplies numerics.

A backend owns the model's weights, its KV cache and an opaque hidden-state type `H` (a torch
tensor, a numpy array...). The core never looks inside `H`; it only passes it back.

Required of every backend (`Backend`): prefill prompts at full depth, decode one token per
sequence at full depth, commit it. That is a complete engine (llama.cpp is one); River's
method needs more, declared in two places that must agree:

- `Capabilities`: what a backend promises before anything loads, so a plan is checked against
  it first and a bad setting never waits for a long load;
- the sub-protocols below: what the loaded backend implements, checked with `isinstance`
  (the conformance kit checks that every promise is kept).

Cache model. Every layer has one K/V slot per position. `prefill` fills positions 0..T-1 of
every layer. Each decode step then writes exactly one new position, the same one in every
layer, at index `offset`; `commit()` advances `offset`. Between `embed` and `commit` the core
calls, for every layer i in order, one of (for each row of the batch):

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

So after any sequence of exits every layer holds the same number of positions (some of them
marked absent under `mask`, some not yet written under `recompute`).

`rows` selects batch rows (a sorted list of row indices) or None for all of them. Layer calls
return a new `H` of the full batch in which only `rows` changed. A layer-by-layer engine need
not write the bookkeeping: `river_core.layer_engine.LayerEngine` implements the cache's side
(through `river_core.cache.KVCache`) and asks only for numerics.
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
    """What a backend promises, known before it loads: nothing beyond full-depth decoding of
    one sequence unless it says so. The core refuses anything not declared here with a clear
    error; each promise names the sub-protocol that keeps it."""

    exits: bool = False       # `Layered`: a token can stop part-way through the backbone
    stand_in: bool = False    # `StandIns`
    propagate: bool = False   # `ProjectsKV`
    mask: bool = False        # `MasksEntries`
    recompute: bool = False   # `RecomputesSpans`, batch 1
    sub_blocks: bool = False  # `layer(..., sub_blocks=True)` reports the sub-blocks' cosines
    verify: bool = False      # `Verifies`: speculative decoding, batch 1
    windowed_drafts: bool = False  # drafts can attend a window of the context (draft_window)
    batch: bool = False       # accepts more than one sequence
    sequences: bool = True    # keeps each sequence's exit state (its policy's, its
                              # predictor's) across steps; False where the engine sees tokens,
                              # not requests (inside vLLM)
    rerun: bool = True        # can run backbone layers again for chosen rows after a step
                              # (a policy's recheck)
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
    prompt's tokens: the predictor's prior for how much each block moves the state (1.0 where
    a backend cannot observe layers).
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
class Backend(Protocol):
    """What every backend supplies: full-depth decoding over its own cache."""

    name: str
    num_layers: int
    max_positions: int
    capabilities: Capabilities
    tokenizer: Tokenizer
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

    def decode(self, tokens: Sequence[int]) -> np.ndarray:
        """One token per sequence through every backbone layer at position `offset`, writing
        its slots: [batch, vocab] float32 logits. `commit` then advances `offset`."""

    def commit(self) -> None:
        """Advance `offset` past the position this step wrote."""

    def footprint(self) -> Footprint:
        """What a decode step reads from memory, for speed limits in benchmarks."""


@runtime_checkable
class Layered(Backend, Protocol, Generic[H]):
    """Layer by layer (`Capabilities.exits`): the core walks the layers itself."""

    def embed(self, tokens: Sequence[int]) -> H: ...

    def layer(self, i: int, h: H, rows: Rows,
              sub_blocks: bool = False) -> tuple[H, np.ndarray | None]:
        """Backbone layer i for `rows`, and with `sub_blocks` (`Capabilities.sub_blocks`)
        [len(rows), 2] float cosines of each row's last token before and after the attention
        sub-block, and before and after the MLP sub-block (what the paper's rule reads);
        else None."""

    def similarity(self, before: H, after: H, rows: Rows) -> list[float]:
        """Cosine of each selected row's last token before and after a layer."""

    def logits(self, h: H) -> np.ndarray:
        """Final norm and LM head: [batch, vocab] float32."""

    def read_kv(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer i's keys and values for positions 0..offset-1: two [batch, kv_heads, offset,
        head_dim] float32 arrays. For tests and measurements, not the hot path."""


@runtime_checkable
class StandIns(Protocol, Generic[H]):
    """`Capabilities.stand_in`: every layer has a stand-in, its weight-quantized copy."""

    stand_in_error: Sequence[float]
    """Per layer: relative weight error of its stand-in, ||Q(W) - W|| / ||W|| over the layer's
    projections. The predictor scales its KV-error estimate by it."""

    def stand_in_layer(self, i: int, h: H, rows: Rows) -> H: ...


@runtime_checkable
class ProjectsKV(Protocol, Generic[H]):
    """`Capabilities.propagate`."""

    def project_kv(self, i: int, h: H, rows: Rows) -> None: ...


@runtime_checkable
class MasksEntries(Protocol):
    """`Capabilities.mask`."""

    def skip(self, i: int, rows: Rows) -> None: ...


@runtime_checkable
class RecomputesSpans(Protocol, Generic[H]):
    """`Capabilities.recompute`."""

    def layer_span(self, i: int, states: Sequence[H], start: int) -> list[H]:
        """Layer i for positions start..offset of the one sequence: `states` holds one
        single-token state per position, in order; returns their outputs likewise."""


@runtime_checkable
class Verifies(Protocol):
    """`Capabilities.verify`: speculative decoding, one sequence."""

    def extend(self, tokens: Sequence[int]) -> np.ndarray:
        """Run `tokens` through the whole backbone at positions offset.. of the one sequence,
        write their slots in every layer and commit them: [len(tokens), vocab] float32 logits,
        row t predicting the token after tokens[t]."""

    def rewind(self, offset: int) -> None:
        """Forget positions offset.. (offset <= `offset` now): later steps overwrite them."""


@runtime_checkable
class WindowsDrafts(Protocol):
    """`Capabilities.windowed_drafts`: speculative mode's drafts attend part of the context."""

    def window_drafts(self, window: int | None) -> None:
        """From now on a single-token step attends only the first SINKS positions
        (river_core.layout) and the last `window`; None: all of them again. Verification
        (`extend`) and prefill always attend everything."""


@runtime_checkable
class FusedTail(Protocol, Generic[H]):
    """Optional speed: a token's whole exit river in one call."""

    def stand_in_tail(self, start: int, h: H, rows: Rows) -> H:
        """The stand-ins of layers start..L-1 in turn (the same result as `stand_in_layer`
        for each; any start must work)."""


@runtime_checkable
class DraftHead(Protocol, Generic[H]):
    """Optional speed: the LM head at stand-in precision, for drafts, whose logits only pick
    a token the backbone then checks."""

    def stand_in_logits(self, h: H) -> np.ndarray: ...


@runtime_checkable
class MixedLayers(Protocol, Generic[H]):
    """Optional: an engine that must run a layer's backbone rows and stand-in rows in one call
    (one attention call per layer for the whole batch, as inside vLLM)."""

    def mixed_layer(self, i: int, h: H, deep: Rows, gone: Rows,
                    sub_blocks: bool = False) -> tuple[H, np.ndarray | None]:
        """Layer i: the backbone for `deep` rows, the stand-in for `gone` rows; the deep rows'
        sub-block cosines as `Layered.layer` gives them."""


PROMISES = {"exits": Layered, "stand_in": StandIns, "propagate": ProjectsKV,
            "mask": MasksEntries, "recompute": RecomputesSpans, "verify": Verifies,
            "windowed_drafts": WindowsDrafts}
"""Each promise of `Capabilities` and the sub-protocol that keeps it."""
