"""Value types that configure a run. Validated on construction, types and ranges, so bad
input fails early with one line (a `ConfigError`), the same from the command line and the
API, before any model loads."""

from __future__ import annotations

import enum
import math
import numbers
from typing import Any, Mapping

import attrs

from .errors import ConfigError


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _kind(value: Any) -> str:
    return type(value).__name__


def _integer(name: str, value: Any, low: int, what: str = "") -> None:
    _check(isinstance(value, numbers.Integral) and not isinstance(value, bool),
           f"{name} must be an integer{what}, got {value!r} ({_kind(value)})")
    _check(value >= low, f"{name} must be >= {low}, got {value}")


def _number(name: str, value: Any) -> float:
    _check(isinstance(value, numbers.Real) and not isinstance(value, bool),
           f"{name} must be a number, got {value!r} ({_kind(value)})")
    _check(math.isfinite(value), f"{name} must be finite, got {value}")
    return float(value)


def _text(name: str, value: Any) -> None:
    _check(isinstance(value, str), f"{name} must be text (str), got {value!r} ({_kind(value)})")


def _stops(value: Any) -> tuple[str, ...]:
    """One stop string or several; never a string's characters."""
    if isinstance(value, str):
        return (value,)
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"stop must be a string or a list of strings, got {value!r} "
                          f"({_kind(value)})")
    return tuple(value)


METHODS = ("hqq", "rtn", "hqq-int", "rtn-int", "sym")


@attrs.frozen
class QuantSpec:
    """How the stand-in layers' weights are quantized (weights only; no training, no data).

    bits=4 (default, as the paper): asymmetric, one scale and zero point per `group_size` input
    columns (or the largest supported group dividing a layer's width), by `method`: "hqq"
    (Half-Quadratic Quantization, the paper's default) or "rtn" (round to nearest); with the
    suffix "-int" ("hqq-int", "rtn-int") the zero points are then rounded to integers, the grid
    ONNX Runtime's MatMulNBits runs without a correction (fewer nodes a stand-in, a little more
    weight error).
    bits=8: symmetric, one scale per output row; with `method` "sym" one per `group_size`
    input columns (ggml's Q8_0 at 32).
    """

    bits: int = 4
    group_size: int = 64
    method: str = "hqq"

    def __attrs_post_init__(self) -> None:
        _check(self.bits in (4, 8) and not isinstance(self.bits, bool),
               f"stand-in precision must be 4 or 8 bits, got {self.bits!r}")
        _check(self.group_size in (32, 64, 128, 256) and not isinstance(self.group_size, bool),
               f"group size must be 32, 64, 128 or 256, got {self.group_size!r}")
        _check(self.method in METHODS,
               f"quantizer must be one of {', '.join(METHODS)}, got {self.method!r}")

    @property
    def label(self) -> str:
        return "int8" if self.bits == 8 else f"int{self.bits} g{self.group_size} {self.method}"


class Mode(enum.StrEnum):
    """What an exited token is: the one encoding of the mode, read through
    `ExitConfig.lossless` by the core, every engine and River inside vLLM."""

    EXIT = "exit"                 # final (the paper; fast, lossy)
    SPECULATIVE = "speculative"   # a draft the backbone verifies (lossless)


MODES = tuple(m.value for m in Mode)
EXIT_HEADS = ("backbone", "stand-in")
DRAFT_WINDOW = 256
"""Speculative mode's default draft window: shorter contexts are read whole, so drafts change
only past it (docs/benchmarks.md, "Lossless mode at long contexts and short answers")."""


DRAFTS = ("river", "ngram")
"""Speculative mode's draft sources where none are named: the river, and the context's own
n-grams where they propose (free drafts that pay where the answer copies the prompt)."""


def _drafts(value: Any) -> tuple[str, ...]:
    """Draft source names: "river,ngram" or a list of them."""
    names = value.split(",") if isinstance(value, str) else value
    _check(isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names),
           f"drafts must name draft sources, as 'river,ngram' or a list, got {value!r}")
    names = tuple(n.strip() for n in names)
    _check(bool(names) and all(names) and len(set(names)) == len(names),
           f"drafts must name one draft source or more, each once, got {value!r}")
    return names


POLICIES = {"exit": ("settled", {}), "speculative": ("fixed", {"layer": -1})}
"""Each mode's exit policy and its options where none is named. Exit mode: the paper's rule.
Speculative mode: drafts from the stand-ins alone (no backbone layer), faster than drafts by
the paper's rule on both CPU engines (docs/benchmarks.md, "The speculative defaults")."""


def mode_policy(mode: str) -> tuple[str, dict]:
    """The policy and options a mode runs where none is named (POLICIES)."""
    name, options = POLICIES.get(mode, POLICIES["exit"])
    return name, dict(options)


def _mode(value: Any) -> Mode:
    _check(value in MODES, f"mode must be one of {', '.join(MODES)}, got {value!r}")
    return Mode(value)


def _mode_options(config: "ExitConfig") -> dict:
    name, options = mode_policy(config.mode)
    return options if config.policy == name else {}


@attrs.frozen
class ExitConfig:
    """Which exit policy, predictor and KV strategy run, and their options by name (each
    plugin declares its own: `river plugins` lists them). A policy left unnamed is the mode's
    (POLICIES), with its options unless others are given."""

    mode: Mode = attrs.field(default=Mode.EXIT, converter=_mode)
    """"exit": a token that exits is final (the paper; fast, lossy). "speculative": exited
    tokens are drafts the backbone verifies, several at once (lossless: the backbone's output)."""
    policy: str = attrs.field(default=attrs.Factory(lambda c: mode_policy(c.mode)[0],
                                                    takes_self=True))
    kv: str = "river"
    predictor: str = "transition"
    options: Mapping[str, Any] = attrs.field(default=attrs.Factory(_mode_options, takes_self=True),
                                             converter=lambda o: _options(o))
    prefill_exit: int | None = None
    """Sequence-level exit of the prompt (as the paper): its layers past this one run their
    stand-ins; None runs the prompt at full depth. Only with the `river` strategy."""
    draft_tokens: int = 2
    """Speculative mode: the most tokens drafted per verification. Two by default: verifying
    three tokens costs hardly more than one on either CPU engine, five costs much more, and on
    the README's prompt and GSM8K train two was the fastest length on both
    (docs/benchmarks.md, "Lossless mode at long contexts and short answers")."""
    adaptive: bool = True
    """Speculative mode: let the draft length follow the drafts' runs (one more after a round
    kept whole, one less after a rejection) and take plain steps where drafting does not pay.
    On by default (docs/benchmarks.md, "The speculative defaults"). Because it follows measured
    time, a seeded sampled generation repeats only with it off."""
    drafts: tuple[str, ...] = attrs.field(default=DRAFTS, converter=_drafts)
    """Speculative mode: where drafts come from (draft source plugins, `river plugins` lists
    them). Each round drafts from the source measured cheapest a token that proposes, or
    takes a plain step where none pays (speculative.DraftLength)."""
    step_aside_above: int | None = None
    """Rows decoding in one step above which River steps aside: exit mode runs that step at
    full depth, speculative mode drafts nothing for it (None: never). Where per-token exits
    stop paying depends on the machine and the engine: `river bench vllm` measures the
    crossover (docs/scaling.md)."""
    exit_head: str = "backbone"
    """Exit mode: the head a token that exited takes. "backbone": the model's own LM head,
    as the paper (and every token at full depth); "stand-in": the head's 8-bit stand-in,
    which reads half of an F16 head's bytes (on a small model the head is a large share of
    what an exited token reads), a quality trade like the river's: measured on the ggml
    engine in docs/backends.md. Exit mode only, on a backend with a head's stand-in."""
    draft_window: int | None = None
    """Speculative mode: drafts attend the context's first 4 positions and its last
    `draft_window`. The backbone's verification keeps the output exact, so only how many
    drafts it keeps can change; a long context's drafts cost less. None: DRAFT_WINDOW where
    the backend can window drafts, else the whole context (a window longer than the context
    is the whole context)."""

    @property
    def lossless(self) -> bool:
        """Speculative mode: the backbone verifies what the river drafts."""
        return self.mode is Mode.SPECULATIVE

    @property
    def stand_in_head(self) -> bool:
        """Exit mode's exited tokens take the head's stand-in (`exit_head`)."""
        return self.exit_head == "stand-in"

    def __attrs_post_init__(self) -> None:
        for name in ("policy", "kv", "predictor"):
            _text(name, getattr(self, name))
        if self.prefill_exit is not None:
            _integer("prefill_exit", self.prefill_exit, -1, " or None")
        _integer("draft_tokens", self.draft_tokens, 1)
        _check(isinstance(self.adaptive, bool), f"adaptive must be True or False, got "
               f"{self.adaptive!r}")
        if self.draft_window is not None:
            _integer("draft_window", self.draft_window, 1, " or None")
        if self.step_aside_above is not None:
            _integer("step_aside_above", self.step_aside_above, 0, " or None")
        _check(self.exit_head in EXIT_HEADS, f"exit_head must be one of {', '.join(EXIT_HEADS)}, "
               f"got {self.exit_head!r}")


def _options(options: Any) -> dict:
    _check(isinstance(options, Mapping), f"options must be a mapping of names to values, got "
           f"{options!r} ({_kind(options)})")
    return dict(options)


@attrs.frozen
class GenerationConfig:
    """Decoding settings. temperature 0 means greedy; top_k 0 keeps every token; `stop`: one
    string or several, each non-empty; `ignore_eos`: decode max_new_tokens tokens whatever
    end of text the model picks (llama.cpp's --ignore-eos: timings of a fixed length)."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = attrs.field(default=(), converter=_stops)
    seed: int = 0
    ignore_eos: bool = False

    def ends(self, tokenizer) -> frozenset[int]:
        """The tokens that end a generation: the tokenizer's end of text, none with
        ignore_eos."""
        return frozenset() if self.ignore_eos else tokenizer.eos_ids

    def __attrs_post_init__(self) -> None:
        _integer("max_new_tokens", self.max_new_tokens, 1)
        _check(_number("temperature", self.temperature) >= 0.0,
               f"temperature must be >= 0, got {self.temperature}")
        _check(0.0 < _number("top_p", self.top_p) <= 1.0,
               f"top_p must be in (0, 1], got {self.top_p}")
        _integer("top_k", self.top_k, 0, " (0: every token)")
        _integer("seed", self.seed, 0)
        _check(self.seed < 2 ** 63, f"seed must be below 2**63, got {self.seed}")
        for s in self.stop:
            _text("a stop string", s)
            _check(s != "", "a stop string must not be empty")
