"""Value types that configure a run. Validated on construction so bad input fails early."""

from __future__ import annotations

import attrs

from .errors import ConfigError


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


@attrs.frozen
class RiverSpec:
    """How a backend builds its stand-in ("river") layers: round-to-nearest weight quantization.

    bits=8: symmetric per output channel. bits=4: asymmetric, one scale and zero per `group_size`
    input columns. No training and no calibration data.
    """

    bits: int = 8
    group_size: int = 128

    def __attrs_post_init__(self) -> None:
        _check(self.bits in (4, 8), f"river precision must be 4 or 8 bits, got {self.bits}")
        _check(self.group_size in (32, 64, 128, 256),
               f"river group size must be 32, 64, 128 or 256, got {self.group_size}")


@attrs.frozen
class ExitConfig:
    """Which exit policy and KV strategy run, and their knobs.

    threshold: largest predicted cumulative KV error (see predictor.py) a token may leave with.
    min_layer: earliest layer a token may leave after; None means a quarter of the depth.
    layer: the fixed exit layer, for policies that take one; -1 sends every token into the river
        before the first layer (the whole model at river precision).
    """

    policy: str = "similarity"
    kv: str = "river"
    threshold: float = 0.15
    min_layer: int | None = None
    layer: int | None = None
    predictor: str = "transition"

    def __attrs_post_init__(self) -> None:
        _check(0.0 <= self.threshold <= 10.0, f"threshold must be in [0, 10], got {self.threshold}")
        _check(self.min_layer is None or self.min_layer >= 0,
               f"min_layer must be >= 0, got {self.min_layer}")
        _check(self.layer is None or self.layer >= -1,
               f"layer must be >= -1 (-1: before the first layer), got {self.layer}")


@attrs.frozen
class GenerationConfig:
    """Decoding settings. temperature 0 means greedy."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        _check(self.max_new_tokens > 0, f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        _check(self.temperature >= 0.0, f"temperature must be >= 0, got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
