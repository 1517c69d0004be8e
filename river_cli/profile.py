"""Calibration profiles: an exit policy's fitted options for one model at one river precision,
kept in the user cache where `river generate` finds them (`river calibrate` writes them, and
`river generate` at a model's first exit-mode call: operating_point.py), or shipped with River
for the embedded model (data/profiles)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

import attrs

from river_core.contract.backend import Backend, StandIns
from river_core.settings.config import ExitConfig
from river_core.settings.errors import ConfigError
from river_models import cache_root

FORMAT = 2   # 2: the gap target, the whole 4-bit model's quality and the held-apart check
             # (a profile of nothing fitted, `Point.ceiling`, reads as format 2 too)
METRICS = ("agreement", "nll", "gap")
SHIPPED = Path(__file__).resolve().parent / "data" / "profiles"


def fingerprint(backend: Backend) -> str:
    """A model at a river precision: its depth and its stand-ins' per-layer weight error, which
    the same weights and quantizer give on every engine and another model or precision does
    not."""
    eps = ",".join(f"{e:.4g}" for e in backend.stand_in_error)
    return hashlib.sha256(f"{backend.num_layers}|{eps}".encode()).hexdigest()[:16]


def default_path(backend: Backend, policy: str, root: Path | None = None) -> Path:
    """Where the profile of this model, precision and policy lives under `root` (default: the
    user cache's profiles/, beside the stand-ins it was fitted over)."""
    return (root or cache_root() / "profiles") / f"{fingerprint(backend)}-{policy}.json"


@attrs.frozen
class Target:
    """What calibration holds: `agreement` (share of positions whose next token is full
    depth's, at least `value`), `nll` (NLL increase over full depth, nats per token, at most
    `value`) or `gap` (share of the whole 4-bit model's NLL increase over full depth that exit
    mode recovers, at least `value`: measured against that model on the same prompts)."""

    metric: str
    value: float

    def __attrs_post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ConfigError(f"a target is agreement=SHARE, nll=NATS or gap=SHARE, got "
                              f"{self.metric!r}")
        if self.metric in ("agreement", "gap") and not 0.0 < self.value <= 1.0:
            raise ConfigError(f"an {self.metric} target is in (0, 1], got {self.value}")
        if self.metric == "nll" and self.value < 0.0:
            raise ConfigError(f"an NLL target is >= 0 nats, got {self.value}")

    @classmethod
    def parse(cls, text: str) -> "Target":
        metric, sep, value = text.partition("=")
        try:
            return cls(metric.strip(), float(value))
        except ValueError:
            raise ConfigError(f"a target is agreement=SHARE, nll=NATS or gap=SHARE, got "
                              f"{text!r}") from None

    def resolved(self, whole_model: "Quality") -> "Target":
        """An absolute target: `gap` as the NLL increase it allows, given the whole 4-bit
        model's on the same prompts (a whole model no worse than full depth leaves no gap)."""
        if self.metric != "gap":
            return self
        return Target("nll", (1.0 - self.value) * max(whole_model.nll_delta, 0.0))

    def met(self, quality: "Quality", whole_model: "Quality | None" = None) -> bool:
        if self.metric == "gap":
            if whole_model is None:
                raise ConfigError("a gap target is measured against the whole 4-bit model")
            return self.resolved(whole_model).met(quality)
        if self.metric == "agreement":
            return quality.agreement >= self.value
        return quality.nll_delta <= self.value

    def __str__(self) -> str:
        return f"{self.metric}={self.value:g}"


DEFAULT_TARGET = Target("gap", 0.5)
"""The paper's own claim: exit mode recovers at least half of the whole 4-bit model's NLL gap
(below that, the whole model on stand-ins is the better choice, at more speed)."""


@attrs.frozen
class Quality:
    """Teacher-forced on full depth's greedy continuations: the share of positions whose top-1
    is full depth's token, the NLL of those tokens minus full depth's, layers run per token."""

    agreement: float
    nll_delta: float
    mean_layers: float

    def recovered(self, whole_model: "Quality") -> float | None:
        """The share of the whole 4-bit model's NLL gap this point recovers (None: no gap)."""
        gap = whole_model.nll_delta
        return 1.0 - self.nll_delta / gap if gap > 0 else None


@attrs.frozen
class LayerRow:
    """Every token exiting after `exit_layer` (-1: stand-ins only): its quality and the real
    relative K/V error the river left in the skipped layers (None: the engine hides its cache)."""

    exit_layer: int
    quality: Quality
    kv_error: float | None


@attrs.frozen
class Trial:
    value: float
    quality: Quality


@attrs.frozen
class Measured:
    """A setting of the tuned option on the held-apart prompts: its quality, and its decode
    speed over full depth's (full depth's ms/token over its own, timed in the same run)."""

    value: float
    quality: Quality
    speed: float


@attrs.frozen
class Point:
    """The operating point chosen at a model's first exit-mode call (operating_point.py):
    checked on prompts held apart from the fit, against the whole 4-bit model there."""

    prompts: str
    # None, these three, where exit mode cannot pay (`ceiling` below FASTER): nothing fitted
    whole_model: Quality | None   # every token on stand-ins, on the held-apart prompts
    fitted: Measured | None       # the fitted value
    default: Measured | None      # the policy's own default (the paper's tau for settled)
    reached: bool             # the target met there, faster than full depth
    seconds: float            # the whole fit's wall-clock
    ceiling: float | None = None  # the decode speed over full depth's of the tuned option's
                                  # permissive end, the fewest layers a token: the most any
                                  # setting reaches


@attrs.frozen
class Profile:
    model: str                        # as named at calibration (shown, not matched)
    fingerprint: str                  # what is matched: see fingerprint()
    precision: str                    # the river's, e.g. "int4 g64 hqq"
    policy: str
    options: Mapping[str, Any] = attrs.field(converter=dict)   # the fitted option(s)
    target: Target
    quality: Quality | None           # at `options`, on the calibration prompts (None:
                                      # nothing fitted, `Point.ceiling`)
    prompts: str                      # where the prompts came from, and how many
    tokens: int                       # continuation tokens per prompt
    trials: tuple[Trial, ...] = attrs.field(converter=tuple)
    layers: tuple[LayerRow, ...] = attrs.field(converter=tuple)
    whole_model: Quality | None = None   # every token on stand-ins, on the calibration prompts
    point: Point | None = None           # None: made by `river calibrate`
    format: int = FORMAT

    @property
    def met(self) -> bool:
        """The target held at the fitted value on the calibration prompts."""
        return self.quality is not None and self.target.met(self.quality, self.whole_model)

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(attrs.asdict(self), indent=1) + "\n")
        os.replace(tmp, path)   # a reader never sees half a profile
        return path

    @classmethod
    def load(cls, path: Path) -> "Profile":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read calibration profile {path}: {e}") from None
        if data.get("format") != FORMAT:
            raise ConfigError(f"{path} is a calibration profile of format "
                              f"{data.get('format')}, this River reads {FORMAT}: calibrate again")
        quality = lambda q: None if q is None else Quality(**q)
        measured = lambda m: None if m is None else \
            Measured(m["value"], quality(m["quality"]), m["speed"])
        point = data.get("point")
        if point is not None:
            point = Point(**{**point, "whole_model": quality(point["whole_model"]),
                             "fitted": measured(point["fitted"]),
                             "default": measured(point["default"])})
        return cls(**{**data, "target": Target(**data["target"]),
                      "quality": quality(data["quality"]),
                      "trials": [Trial(t["value"], quality(t["quality"])) for t in data["trials"]],
                      "layers": [LayerRow(r["exit_layer"], quality(r["quality"]), r["kv_error"])
                                 for r in data["layers"]],
                      "whole_model": quality(data.get("whole_model")), "point": point})

    @classmethod
    def find(cls, backend: Backend, policy: str) -> "Profile | None":
        """The profile saved for this model, precision and policy in the user cache (`river
        calibrate`'s, or the one fitted at the model's first exit-mode call), else the one
        shipped with River, if any (none for a backend without stand-ins, which has no exits
        to calibrate)."""
        if not isinstance(backend, StandIns):
            return None
        for root in (None, SHIPPED):
            path = default_path(backend, policy, root)
            if path.is_file():
                return cls.load(path)
        return None

    def check(self, backend: Backend, path: Path) -> None:
        """Refuse a profile made for another model or river precision."""
        if self.fingerprint != fingerprint(backend):
            raise ConfigError(f"calibration profile {path} was made for {self.model} "
                              f"({self.precision}), not the loaded model at this precision: "
                              "calibrate it (river calibrate) or pass --no-profile")

    def exit_config(self, config: ExitConfig) -> ExitConfig:
        """`config` with this profile's policy and fitted options, under any option `config`
        sets itself."""
        if config.policy != self.policy:
            raise ConfigError(f"the calibration profile is for policy {self.policy}, not "
                              f"{config.policy}")
        return attrs.evolve(config, options={**self.options, **config.options})

    def describe(self) -> str:
        fitted = ", ".join(f"{k}={v:.4g}" for k, v in self.options.items())
        q = self.quality
        return (f"{self.policy} {fitted} for {self.target} ({self.prompts}: agreement "
                f"{q.agreement:.3f}, NLL {q.nll_delta:+.3f}, {q.mean_layers:.1f} layers/token)")
