"""Calibration without training: fit an exit policy's threshold to a quality target on the
user's own prompts, with forward passes only.

1. Reference: full depth's greedy continuation of every prompt (`tokens` tokens) and the NLL
   full depth gives it.
2. Per layer, on the first `layer_prompts` prompts: every token exits after layer k, for each
   k in turn; the continuation is teacher-forced through the river, then measured: the share
   of positions whose top-1 is still full depth's token, the NLL increase, and the real
   relative K/V error the river left in the skipped layers against full depth's cache.
3. Fit: the policy's option marked `tune=(strict, permissive)` (options.py), bisected between
   those ends for the most permissive value whose teacher-forced quality over all prompts meets
   the target (quality is taken to fall as the value moves toward `permissive`). A `gap` target
   (`gap=0.5`: recover half the whole 4-bit model's NLL increase over full depth) is first
   measured there: every token on stand-ins, teacher-forced over the same continuations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import attrs
import numpy as np

from river_core.contract.backend import Backend
from river_core.settings.config import ExitConfig, GenerationConfig
from river_core.loop.decode import Forced
from river_core.settings.errors import CapabilityError, ConfigError
from river_core.model import RiverModel
from river_core.settings.options import tuned
from river_core.method.predictor import relative_error

from .profile import LayerRow, Profile, Quality, Target, Trial, fingerprint

if TYPE_CHECKING:
    from tqdm import tqdm

FULL = ExitConfig(kv="full")
STEPS = 7   # bisection halvings: the fitted value within 1/128 of the search range
BATCH = 8   # sequences per engine call: per-call overhead, not bytes, decides speed here


@attrs.frozen
class Reference:
    prompt: list[int]
    continuation: list[int]        # full depth's greedy tokens
    full_nll: float                # summed over continuation[1:]: the positions exits change
    full_kv: list[np.ndarray] | None   # per layer, full depth's K and V of the continuation

    @property
    def scored(self) -> int:
        return len(self.continuation) - 1


def _nll(forced: Forced, continuation: Sequence[int]) -> float:
    """Summed NLL of continuation[1:] (continuation[0] follows from the prompt's prefill)."""
    return sum(forced.token_nll(continuation)[1:])


def _read_kv(backend: Backend, start: int,
             lengths: Sequence[int]) -> list[list[np.ndarray]] | None:
    """Per row, per layer: K and V side by side of the row's `lengths[r]` positions from slot
    `start` on (continuations start together after the left-padded prompts); None if the
    engine hides its cache."""
    try:
        layers = [np.concatenate(backend.read_kv(i), axis=-1)
                  for i in range(backend.num_layers)]
    except CapabilityError:
        return None
    return [[kv[r, :, start:start + n] for kv in layers] for r, n in enumerate(lengths)]


def _chunks(model: RiverModel, items: Sequence, batch: bool) -> list[Sequence]:
    """Batches for the engine (fewer, larger calls) where the backend and strategy take them."""
    size = BATCH if model.backend.capabilities.batch and batch else 1
    return [items[i:i + size] for i in range(0, len(items), size)]


def full_depth_references(model: RiverModel, prompts: Sequence[Sequence[int]], tokens: int,
                          keep_kv: int, tick: Callable[[], None]) -> list[Reference]:
    """Full depth's continuation of every prompt that gives at least two tokens; the first
    `keep_kv` keep full depth's K/V of theirs."""
    found = []
    for chunk in _chunks(model, [list(q) for q in prompts], True):
        out = model.generate_ids(chunk, FULL, GenerationConfig(max_new_tokens=tokens))
        found += [Reference(q, c, 0.0, None) for q, c in zip(chunk, out.tokens) if len(c) >= 2]
        for _ in chunk:
            tick()
    untick = lambda: None
    runs, states = force(model, found[:keep_kv], FULL, untick, keep_kv=True)
    runs += force(model, found[keep_kv:], FULL, untick)[0]
    states += [None] * (len(runs) - len(states))
    return [attrs.evolve(ref, full_nll=_nll(forced, ref.continuation), full_kv=kv)
            for (ref, forced), kv in zip(runs, states)]


def force(model: RiverModel, refs: Sequence[Reference], config: ExitConfig,
          tick: Callable[[], None], exits: int | None = None,
          keep_kv: bool = False) -> tuple[list[tuple[Reference, Forced]], list[list] | None]:
    """Every reference's continuation teacher-forced under `config` (every token exiting after
    layer `exits` instead, if given), in batches; with `keep_kv`, each row's K/V afterwards."""
    plan = model.plan(config)
    runs, states = [], []
    for chunk in _chunks(model, refs, plan.kv_plugin.make.batch):
        # the capacity of the generation that made the continuations: forcing runs over
        # its prefill, and every setting's over the same one (`KeepsPrefill`)
        forced = model.teacher_force(
            [r.prompt for r in chunk], [r.continuation[:-1] for r in chunk], plan,
            None if exits is None else [exits] * max(r.scored for r in chunk),
            max(len(r.prompt) for r in chunk) + max(len(r.continuation) for r in chunk))
        if keep_kv:
            found = _read_kv(model.backend, max(len(r.prompt) for r in chunk),
                             [r.scored for r in chunk])
            states += found if found is not None else [None] * len(chunk)
        runs += zip(chunk, forced)
        for _ in chunk:
            tick()
    return runs, states if keep_kv else None


def quality(runs: Sequence[tuple[Reference, Forced]]) -> Quality:
    """Token-weighted over every reference."""
    agree = nll = layers = 0.0
    n = max(sum(ref.scored for ref, _ in runs), 1)
    for ref, forced in runs:
        agree += sum(int(np.argmax(z)) == t
                     for z, t in zip(forced.logits[1:], ref.continuation[1:]))
        nll += _nll(forced, ref.continuation) - ref.full_nll
        layers += sum(k + 1 for k in forced.exit_layers[:ref.scored])
    return Quality(agree / n, nll / n, layers / n)


def layer_table(model: RiverModel, refs: Sequence[Reference], config: ExitConfig,
                tick: Callable[[], None]) -> list[LayerRow]:
    """Every token exiting after each layer in turn, through `config`'s KV strategy."""
    n = model.backend.num_layers
    rows = []
    for k in range(-1, n - 1):
        runs, states = force(model, refs, config, tick, exits=k, keep_kv=True)
        errors = [relative_error(river[i], ref.full_kv[i])
                  for ref, river in zip(refs, states) if river is not None and ref.full_kv
                  for i in range(k + 1, n)]
        rows.append(LayerRow(k, quality(runs), float(np.mean(errors)) if errors else None))
    return rows


def fit(model: RiverModel, references: Sequence[Reference], config: ExitConfig, target: Target,
        tick: Callable[[], None], steps: int = STEPS,
        hopeless: Callable[[Quality], bool] | None = None) -> tuple[Trial, list[Trial]]:
    """The most permissive value of the policy's tuned option that meets `target` (the strict
    end when none does), and every value tried, bisecting `steps` times. `hopeless(quality)`
    of a value that misses the target: no stricter value (more layers a token) can be worth
    running either, so the search stops there, that value its answer (not met)."""
    name, strict, permissive = tuned_option(model.registry, config)

    def trial(x: float) -> Trial:
        value = strict + x * (permissive - strict)
        tried = attrs.evolve(config, options={**config.options, name: value})
        return Trial(value, quality(force(model, references, tried, tick)[0]))

    trials = [trial(1.0)]
    best = trials[0] if target.met(trials[0].quality) else None
    lo, hi = 0.0, 1.0
    for _ in range(steps if best is None else 0):
        if hopeless is not None and not target.met(trials[-1].quality) and \
                hopeless(trials[-1].quality):
            return (best or trials[-1]), trials
        trials.append(trial((lo + hi) / 2))
        if target.met(trials[-1].quality):
            lo, best = (lo + hi) / 2, trials[-1]
        else:
            hi = (lo + hi) / 2
    if best is None and hopeless is not None:   # the strict end is full depth: no faster
        return trials[-1], trials
    if best is None:
        trials.append(trial(0.0))
        best = trials[-1]
    return best, trials


def tuned_option(registry, config: ExitConfig) -> tuple[str, float, float]:
    if config.lossless:
        raise ConfigError("calibration fits exit mode; speculative mode is lossless already")
    mark = tuned(registry.policy(config.policy).options)
    if mark is None:
        raise ConfigError(f"policy {config.policy} marks no option for calibration "
                          "(option(..., tune=(strict, permissive)))")
    if mark[0] in config.options:
        raise ConfigError(f"calibration fits {mark[0]}: leave it unset")
    return mark


def whole_model(model: RiverModel, refs: Sequence[Reference], config: ExitConfig,
                tick: Callable[[], None]) -> Quality:
    """Every token on stand-ins (exiting before layer 0) through `config`'s KV strategy: the
    whole 4-bit model, the point a `gap` target is measured against."""
    return quality(force(model, refs, config, tick, exits=-1)[0])


def calibrate(model: RiverModel, prompts: Sequence[Sequence[int]], config: ExitConfig,
              targets: Sequence[Target], *, tokens: int = 16, layer_prompts: int = 8,
              model_name: str = "", precision: str = "", source: str = "",
              progress: bool = False, bar: tqdm | None = None, steps: int = STEPS,
              hopeless: Callable[[Quality], bool] | None = None) -> list[Profile]:
    """Fit `config`'s policy to each target on `prompts` (token ids): a Profile per target,
    sharing the references and the per-layer table (`fit`'s `steps` and `hopeless`). Its
    passes advance `bar` if given (a caller's own, longer work), else a bar of its own (shown
    with `progress`)."""
    name = tuned_option(model.registry, config)[0]
    n = model.backend.num_layers
    relative = any(t.metric == "gap" for t in targets)
    total = len(prompts) * (1 + relative + (steps + 1) * len(targets)) + \
        min(layer_prompts, len(prompts)) * n
    own = bar is None
    if own:
        from tqdm import tqdm   # here: its import (0.07 s) is paid only where a bar runs

        bar = tqdm(total=0, desc="calibrating", unit="pass", disable=not progress)
    start, bar.total = bar.n, bar.total + total
    tick = lambda: bar.update(1)
    try:
        bar.set_postfix_str("full depth's continuations")
        references = full_depth_references(model, prompts, tokens, layer_prompts, tick)
        if not references:
            raise ConfigError("every prompt's continuation ended at once: nothing to calibrate on")
        whole = None
        if relative:
            bar.set_postfix_str("the whole 4-bit model")
            whole = whole_model(model, references, config, tick)
        layers = []
        if layer_prompts > 0:
            bar.set_postfix_str("each exit layer")
            layers = layer_table(model, references[:layer_prompts], config, tick)
        profiles = []
        for target in targets:
            bar.set_postfix_str(f"fitting {name} for {target}")
            absolute = target if whole is None else target.resolved(whole)
            best, trials = fit(model, references, config, absolute, tick, steps, hopeless)
            profiles.append(Profile(
                model=model_name, fingerprint=fingerprint(model.backend), precision=precision,
                policy=config.policy, options={name: best.value}, target=target,
                quality=best.quality, prompts=f"{len(references)} prompts of {source}",
                tokens=tokens, trials=trials, layers=layers, whole_model=whole))
        # prompts that ended at once and early fits take fewer passes
        bar.total -= total - (bar.n - start)
        bar.refresh()
    finally:
        if own:
            bar.close()
    return profiles
