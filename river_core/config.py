"""Value types that configure a run. Validated on construction so bad input fails early."""

from __future__ import annotations

from typing import Any, Mapping

import attrs

from .errors import ConfigError


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


METHODS = ("hqq", "rtn", "hqq-int", "rtn-int")


@attrs.frozen
class QuantSpec:
    """How the stand-in layers' weights are quantized (weights only; no training, no data).

    bits=4 (default, as the paper): asymmetric, one scale and zero point per `group_size` input
    columns (or the largest supported group dividing a layer's width), by `method`: "hqq"
    (Half-Quadratic Quantization, the paper's default) or "rtn" (round to nearest); with the
    suffix "-int" ("hqq-int", "rtn-int") the zero points are then rounded to integers, the grid
    ONNX Runtime's MatMulNBits runs without a correction (fewer nodes a stand-in, a little more
    weight error).
    bits=8: symmetric, one scale per output row (`group_size` and `method` do not apply).
    """

    bits: int = 4
    group_size: int = 64
    method: str = "hqq"

    def __attrs_post_init__(self) -> None:
        _check(self.bits in (4, 8), f"stand-in precision must be 4 or 8 bits, got {self.bits}")
        _check(self.group_size in (32, 64, 128, 256),
               f"group size must be 32, 64, 128 or 256, got {self.group_size}")
        _check(self.method in METHODS,
               f"quantizer must be one of {', '.join(METHODS)}, got {self.method!r}")

    @property
    def label(self) -> str:
        return "int8" if self.bits == 8 else f"int{self.bits} g{self.group_size} {self.method}"


MODES = ("exit", "speculative")


@attrs.frozen
class ExitConfig:
    """Which exit policy, predictor and KV strategy run, and their options by name (each
    plugin declares its own: `river plugins` lists them)."""

    policy: str = "settled"
    kv: str = "river"
    predictor: str = "transition"
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)
    prefill_exit: int | None = None
    """Sequence-level exit of the prompt (as the paper): its layers past this one run their
    stand-ins; None runs the prompt at full depth. Only with the `river` strategy."""
    mode: str = "exit"
    """"exit": a token that exits is final (the paper; fast, lossy). "speculative": exited
    tokens are drafts the backbone verifies, several at once (lossless: the backbone's output)."""
    draft_tokens: int = 4
    """Speculative mode: the most tokens drafted per verification."""
    adaptive: bool = False
    """Speculative mode: let the draft length follow the drafts' runs (one more after a round
    kept whole, one less after a rejection). Off by default: on GSM8K train a fixed length
    of 4 was faster (docs/benchmarks.md, "Lossless mode")."""

    def __attrs_post_init__(self) -> None:
        _check(self.prefill_exit is None or self.prefill_exit >= -1,
               f"prefill_exit must be >= -1, got {self.prefill_exit}")
        _check(self.mode in MODES, f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        _check(self.draft_tokens >= 1, f"draft_tokens must be >= 1, got {self.draft_tokens}")


@attrs.frozen
class GenerationConfig:
    """Decoding settings. temperature 0 means greedy; top_k 0 keeps every token."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        _check(self.max_new_tokens > 0, f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        _check(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}")
