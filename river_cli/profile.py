"""Calibration profiles: an exit policy's fitted options for one model at one river precision,
kept in the user cache where `river generate` finds them (`river calibrate` writes them)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

import attrs

from river_core.backend import Backend, StandIns
from river_core.config import ExitConfig
from river_core.errors import ConfigError
from river_models import cache_root

FORMAT = 1
METRICS = ("agreement", "nll")


def fingerprint(backend: Backend) -> str:
    """A model at a river precision: its depth and its stand-ins' per-layer weight error, which
    the same weights and quantizer give on every engine and another model or precision does
    not."""
    eps = ",".join(f"{e:.4g}" for e in backend.stand_in_error)
    return hashlib.sha256(f"{backend.num_layers}|{eps}".encode()).hexdigest()[:16]


def default_path(backend: Backend, policy: str) -> Path:
    return cache_root() / "profiles" / f"{fingerprint(backend)}-{policy}.json"


@attrs.frozen
class Target:
    """What calibration holds: `agreement` (share of positions whose next token is full
    depth's, at least `value`) or `nll` (NLL increase over full depth, nats per token, at most
    `value`)."""

    metric: str
    value: float

    def __attrs_post_init__(self) -> None:
        if self.metric not in METRICS:
            raise ConfigError(f"a target is agreement=SHARE or nll=NATS, got {self.metric!r}")
        if self.metric == "agreement" and not 0.0 < self.value <= 1.0:
            raise ConfigError(f"an agreement target is in (0, 1], got {self.value}")
        if self.metric == "nll" and self.value < 0.0:
            raise ConfigError(f"an NLL target is >= 0 nats, got {self.value}")

    @classmethod
    def parse(cls, text: str) -> "Target":
        metric, sep, value = text.partition("=")
        try:
            return cls(metric.strip(), float(value))
        except ValueError:
            raise ConfigError(f"a target is agreement=SHARE or nll=NATS, got {text!r}") from None

    def met(self, quality: "Quality") -> bool:
        if self.metric == "agreement":
            return quality.agreement >= self.value
        return quality.nll_delta <= self.value

    def __str__(self) -> str:
        return f"{self.metric}={self.value:g}"


@attrs.frozen
class Quality:
    """Teacher-forced on full depth's greedy continuations: the share of positions whose top-1
    is full depth's token, the NLL of those tokens minus full depth's, layers run per token."""

    agreement: float
    nll_delta: float
    mean_layers: float


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
class Profile:
    model: str                        # as named at calibration (shown, not matched)
    fingerprint: str                  # what is matched: see fingerprint()
    precision: str                    # the river's, e.g. "int4 g64 hqq"
    policy: str
    options: Mapping[str, Any] = attrs.field(converter=dict)   # the fitted option(s)
    target: Target
    quality: Quality                  # at `options`, on the calibration prompts
    prompts: str                      # where the prompts came from, and how many
    tokens: int                       # continuation tokens per prompt
    trials: tuple[Trial, ...] = attrs.field(converter=tuple)
    layers: tuple[LayerRow, ...] = attrs.field(converter=tuple)
    format: int = FORMAT

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
        quality = lambda q: Quality(**q)
        return cls(**{**data, "target": Target(**data["target"]),
                      "quality": quality(data["quality"]),
                      "trials": [Trial(t["value"], quality(t["quality"])) for t in data["trials"]],
                      "layers": [LayerRow(r["exit_layer"], quality(r["quality"]), r["kv_error"])
                                 for r in data["layers"]]})

    @classmethod
    def find(cls, backend: Backend, policy: str) -> "Profile | None":
        """The profile `river calibrate` saved for this model, precision and policy, if any
        (none for a backend without stand-ins, which has no exits to calibrate)."""
        if not isinstance(backend, StandIns):
            return None
        path = default_path(backend, policy)
        return cls.load(path) if path.is_file() else None

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
