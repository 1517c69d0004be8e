"""The backend contract: what an engine supplies. The decode loop and every exit decision live
in the core (decode.py); a backend supplies numerics. A backend author reads this module and
the conformance kit (river_conformance), nothing else.

A backend owns the model's weights, its KV cache and an opaque hidden-state type `H` (a torch
tensor, a numpy array...). The core never looks inside `H`; it only passes it back.

The contract has three parts:

1. **The engine** (`Backend`, required of every backend): prefill prompts at full depth, decode
   one token per sequence at full depth at a position the core names. That is a complete
   engine (llama.cpp is one). `Verifies` adds lossless mode's multi-token pass.
2. **What the walk reads** (`Layered`, and for each promise of `Capabilities` its
   sub-protocol): the layers one by one, so the core decides where each token leaves.
   `river_core.contract.layer_engine.LayerEngine` implements all of it over a backend's numerics.
3. **Measurement** (`Measured`, optional): the cache's contents and the bytes a step reads, for
   the conformance kit and the benchmarks; never on the hot path.

What a backend can do is declared once, in `Capabilities`, before anything loads: a plan is
checked against it (plan.py) and the decode loop reads its flags, never `isinstance` against
the protocols below; the conformance kit checks that every promise is kept.

Cache model, as gpt-fast's `forward(idx, input_pos)`: every layer has one K/V slot per
position, and every step names the slots it writes (`Step`), the same slots in every layer. No
cursor moves behind the core's back: `prefill` fills 0..T-1, a decode step at `Step(p)` writes
slot p, a verification at `start` writes start..start+n-1, and a later step at a position
overwrites whatever an earlier one left there. A step's queries attend only slots before its
end, so a slot past it (a rejected draft's) is never read.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, Sequence, TypeVar, runtime_checkable

import attrs
import numpy as np

from .footprint import Footprint

H = TypeVar("H")
Rows = Sequence[int] | None


@attrs.frozen
class Step:
    """The cache slots one forward pass writes, start..start+tokens-1 of every row (the same
    in every layer), and what its queries attend: everything before its end, or, for a
    single-token draft under `draft_window`, the first SINKS slots and the last
    `draft_window` (river_core.contract.layout.window_slots)."""

    start: int
    tokens: int = 1
    draft_window: int | None = None
    draft: bool = False   # a draft's: what it writes stands only once verification rewrites it
    # start + tokens, kept as a plain attribute: every block of a pass reads it
    end: int = attrs.field(init=False, default=attrs.Factory(
        lambda self: self.start + self.tokens, takes_self=True))


@attrs.frozen(eq=False)
class Pass:
    """One forward pass: its step and the plain tensors every layer of it reads, built once
    per step (`Layered.begin`: from the core's `Layout.view`, each converted once into the
    engine's kind) and handed to every call of the pass. No engine keeps per-step state: what
    a layer needs of the step is here. Per-layer fields hold one entry per layer; layers that
    share an attention window share one object. An engine that needs more per step subclasses
    it (ONNX's sequence lengths, vLLM's attention call)."""

    step: Step | None                # the slots it writes (None inside vLLM, whose own
                                     # metadata places each token)
    ids: Any = None                  # [batch, tokens] int64 token ids on the host (`embed`)
    positions: Any = None            # [batch, tokens] rotary positions
    rope: Sequence[Any] = ()         # per layer: (cos, sin) of its rotary table
    query_scale: Any = None          # factors for q after the rotary, or None (no scaling)
    slots: Sequence[Any] = ()        # per layer: the key slots its queries read
    masks: Sequence[Any] = ()        # per layer: its attention mask (or bias); None: plain
                                     # causal attention over its slots
    indices: dict = attrs.field(factory=dict)   # rows -> the engine's index (`index`)

    def index(self, rows: Sequence[int], make) -> Any:
        """`rows` as the engine's index, `make(rows)`, made once per pass."""
        key = tuple(rows)
        idx = self.indices.get(key)
        if idx is None:
            idx = self.indices[key] = make(rows)
        return idx


@attrs.frozen
class Capabilities:
    """What a backend promises, known before it loads: nothing beyond full-depth decoding of
    one sequence unless it says so. The core refuses anything not declared here with a clear
    error, and reads these flags instead of probing the loaded object; each promise names the
    sub-protocol that keeps it (`PROMISES`, checked by the conformance kit)."""

    exits: bool = False       # `Layered`: a token can stop part-way through the backbone
    stand_in: bool = False    # `StandIns`
    propagate: bool = False   # `ProjectsKV`
    mask: bool = False        # `MasksEntries`
    recompute: bool = False   # `RecomputesSpans`, batch 1
    sub_blocks: bool = False  # `layer(..., sub_blocks=True)` reports the sub-blocks' cosines
    verify: bool = False      # `Verifies`: speculative decoding, batch 1
    windowed_drafts: bool = False  # honours `Step.draft_window`
    batch: bool = False       # accepts more than one sequence
    keeps_prefill: bool = False   # `KeepsPrefill`: teacher-forcing the same prompts again
                              # runs over the prefill already in the cache
    sequences: bool = True    # keeps each sequence's exit state (its policy's, its
                              # predictor's) across steps; False where the engine sees tokens,
                              # not requests (inside vLLM)
    rerun: bool = True        # can run backbone layers again for chosen rows after a step
                              # (a policy's recheck)
    exit_refused: str | None = None   # a loaded model's reason exit mode cannot run on it (its
                              # stand-ins cannot sit below its backbone); lossless mode and full
                              # depth still run


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


# -- 1. the engine -------------------------------------------------------------------------------

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

    def prefill(self, prompts: Sequence[Sequence[int]], capacity: int,
                prefill_exit: int | None = None) -> Prefill:
        """Make a cache with room for `capacity` positions and run `prompts` through every
        layer at slots 0..T-1 (T: the longest prompt): the backbone's up to `prefill_exit`
        (None: all), the stand-ins' past it (the sequence-level exit of prefill; only with
        `Capabilities.stand_in`). Shorter prompts are left-padded; padding is masked from
        attention everywhere, so a row's position p is slot p for every row."""

    def decode(self, tokens: Sequence[int], step: Step) -> np.ndarray:
        """One token per sequence through every backbone layer, writing `step`'s slot in
        every layer: [batch, vocab] float32 logits."""


@runtime_checkable
class Verifies(Protocol):
    """`Capabilities.verify`: speculative decoding, one sequence."""

    def extend(self, tokens: Sequence[int], start: int) -> np.ndarray:
        """Run `tokens` through the whole backbone at slots start..start+len(tokens)-1 of the
        one sequence, attending everything before, and write those slots in every layer:
        [len(tokens), vocab] float32 logits, row t predicting the token after tokens[t].

        Exactly as steps: row t is bitwise what `decode([tokens[t]], Step(start + t))` returns
        after tokens[:t] were decoded a step each, and every slot it writes holds bitwise what
        those steps write. Lossless mode's greedy output is then full depth's whatever drafts
        were tried, on every run (the conformance kit checks it; a kernel whose summation
        order follows the number of tokens breaks it at a near tie)."""

    def trim(self, offset: int) -> None:
        """Positions offset.. hold no tokens any more (mlx-lm's trim: the offset moves,
        nothing is erased; the next step there overwrites them)."""


@runtime_checkable
class KeepsPrefill(Protocol):
    """`Capabilities.keeps_prefill`: calibration teacher-forces every setting it tries over the
    same prompts; the engine gives back the prefill its cache still holds instead of running
    it again (on a 1.5B model on 2 cores a prefill of the fit's questions is 25 s, a setting's
    forced steps 6 s)."""

    def kept_prefill(self, prompts: Sequence[Sequence[int]], capacity: int,
                     prefill_exit: int | None = None) -> Prefill | None:
        """If the cache's last prefill was `prefill(prompts, capacity, prefill_exit)` and no
        step since rewrote the prompts' slots: that prefill's result, the cache's positions
        after the prompts dropped (`trim`). Steps from there compute bitwise what they would
        after a fresh prefill, since each writes its slot before any step reads it. Else
        None."""


# -- 2. what the walk reads ----------------------------------------------------------------------

@runtime_checkable
class Layered(Protocol, Generic[H]):
    """Layer by layer (`Capabilities.exits`): the core walks the layers itself. A step starts
    with `begin`, whose `Pass` every later call of the step takes; between `embed` and the
    head the core calls, for every layer i in order, one of (per row): `layer` (the backbone),
    `stand_in_layer`, `project_kv` or `skip` (what the KV strategy does for rows that left),
    each writing layer i's slots of the step for its rows only.

    Invariants: a layer call takes the full batch's state and returns a new one of the full
    batch in which only `rows` changed (`rows`: sorted row indices, or None for all); a call
    writes the step's slots of its rows in its layer and nothing else."""

    num_layers: int

    def begin(self, tokens: Sequence[int], step: Step) -> Pass:
        """Start a step of one token per sequence at `step`'s slot: its pass."""

    def embed(self, p: Pass) -> H:
        """The pass's tokens' states."""

    def layer(self, p: Pass, i: int, h: H, rows: Rows,
              sub_blocks: bool = False) -> tuple[H, np.ndarray | None]:
        """Backbone layer i for `rows`, and with `sub_blocks` (`Capabilities.sub_blocks`)
        [len(rows), 2] float cosines of each row's last token before and after the attention
        sub-block, and before and after the MLP sub-block (what the paper's rule reads);
        else None."""

    def similarity(self, p: Pass, before: H, after: H, rows: Rows) -> list[float]:
        """Cosine of each selected row's last token before and after a layer."""

    def logits(self, h: H) -> np.ndarray:
        """Final norm and LM head of each row's last token: [batch, vocab] float32."""


@runtime_checkable
class StandIns(Protocol, Generic[H]):
    """`Capabilities.stand_in`: every layer has a stand-in, its weight-quantized copy, which
    reads layer i's cache like the backbone and writes layer i's slot itself (the cache is
    shared, never copied). The three calls beside it have plain defaults in `LayerEngine`
    and exist so an engine can do them faster."""

    stand_in_error: Sequence[float]
    """Per layer: relative weight error of its stand-in, ||Q(W) - W|| / ||W|| over the layer's
    projections. The predictor scales its KV-error estimate by it."""

    def stand_in_layer(self, p: Pass, i: int, h: H, rows: Rows) -> H: ...

    def stand_in_tail(self, p: Pass, start: int, h: H, rows: Rows) -> H:
        """The stand-ins of layers start..L-1 in turn (the result of `stand_in_layer` for
        each; any start must work): a token's whole exit river in one call."""

    def stand_in_logits(self, h: H) -> np.ndarray:
        """The LM head at stand-in precision (or the head itself), for drafts, whose logits
        only pick a token the backbone then checks."""

    def mixed_layer(self, p: Pass, i: int, h: H, deep: list[int], gone: list[int],
                    sub_blocks: bool = False) -> tuple[H, np.ndarray | None]:
        """Layer i: the backbone for `deep` rows, the stand-in for `gone` rows (inside vLLM,
        one attention call for both); the deep rows' cosines as `layer` gives them."""


@runtime_checkable
class ProjectsKV(Protocol, Generic[H]):
    """`Capabilities.propagate`: layer i's K/V of the step's slots computed from `h` without
    running the layer."""

    def project_kv(self, p: Pass, i: int, h: H, rows: Rows) -> None: ...


@runtime_checkable
class MasksEntries(Protocol):
    """`Capabilities.mask`: layer i keeps no entry for `rows` at the step's slot, and every
    later read of layer i masks it out (a later step at that slot writes it again)."""

    def skip(self, p: Pass, i: int, rows: Rows) -> None: ...


@runtime_checkable
class RecomputesSpans(Protocol, Generic[H]):
    """`Capabilities.recompute`, one sequence."""

    def layer_span(self, p: Pass, i: int, states: Sequence[H]) -> list[H]:
        """Backbone layer i for the last len(states) positions up to and including this
        step's slot, causally, writing all their slots: `states` holds one single-token state
        per position, in order (earlier tokens whose layer-i entry was left unwritten, then
        this step's token); returns their outputs likewise. Only the `recompute` strategy
        calls it, and it guarantees that no read of those slots happens before."""


# -- 3. measurement ------------------------------------------------------------------------------

@runtime_checkable
class Measured(Protocol):
    """For the conformance kit and the benchmarks, not the hot path."""

    @property
    def offset(self) -> int:
        """Positions holding tokens: the end of the last step, less what `trim` dropped."""

    def read_kv(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Layer i's keys and values for positions 0..offset-1: two [batch, kv_heads, offset,
        head_dim] float32 arrays."""

    def footprint(self) -> Footprint:
        """What a decode step reads from memory, for speed limits in benchmarks."""


PROMISES = {"exits": Layered, "stand_in": StandIns, "propagate": ProjectsKV,
            "mask": MasksEntries, "recompute": RecomputesSpans, "verify": Verifies,
            "keeps_prefill": KeepsPrefill}
"""Each promise of `Capabilities` and the sub-protocol that keeps it."""
