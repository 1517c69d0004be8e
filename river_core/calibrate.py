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
   the target (quality is taken to fall as the value moves toward `permissive`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import attrs
import numpy as np
from tqdm import tqdm

from .backend import Backend
from .config import ExitConfig, GenerationConfig
from .decode import Forced, teacher_force
from .errors import CapabilityError, ConfigError
from .model import RiverModel, plan
from .options import tuned
from .profile import LayerRow, Profile, Quality, Target, Trial, fingerprint
from .testing import ScriptedPolicy, relative_error

FULL = ExitConfig(kv="full")
STEPS = 7   # bisection halvings: the fitted value within 1/128 of the search range


@attrs.frozen
class Reference:
    prompt: list[int]
    continuation: list[int]        # full depth's greedy tokens
    full_nll: float                # summed over continuation[1:]: the positions exits change
    kv: list[np.ndarray] | None    # per layer, full depth's K and V of the continuation

    @property
    def scored(self) -> int:
        return len(self.continuation) - 1


def _nll(forced: Forced, continuation: Sequence[int]) -> float:
    """Summed NLL of continuation[1:] (continuation[0] follows from the prompt's prefill)."""
    total = 0.0
    for logits, token in zip(forced.logits[1:], continuation[1:]):
        z = logits.astype(np.float64)
        top = z.max()
        total += top + np.log(np.exp(z - top).sum()) - z[token]
    return float(total)


def _kv(backend: Backend, start: int) -> list[np.ndarray] | None:
    """Per layer, K and V of positions start.. side by side; None if the engine hides them."""
    try:
        return [np.concatenate([x[:, :, start:] for x in backend.kv(i)], axis=-1)
                for i in range(backend.num_layers)]
    except CapabilityError:
        return None


def reference(model: RiverModel, prompt: Sequence[int], tokens: int,
              keep_kv: bool = False) -> Reference | None:
    """Full depth's continuation of `prompt`; None when it ends before two tokens."""
    out = model.generate_ids([list(prompt)], FULL, GenerationConfig(max_new_tokens=tokens))
    continuation = out.tokens[0]
    if len(continuation) < 2:
        return None
    forced = model.teacher_force(prompt, continuation[:-1], FULL)
    kv = _kv(model.backend, len(prompt)) if keep_kv else None
    return Reference(list(prompt), continuation, _nll(forced, continuation), kv)


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


def layer_table(model: RiverModel, references: Sequence[Reference], config: ExitConfig,
                tick: Callable[[], None]) -> list[LayerRow]:
    """Every token exiting after each layer in turn, through `config`'s KV strategy."""
    backend = model.backend
    p = plan(model.registry, config, backend)
    rows = []
    for k in range(-1, backend.num_layers - 1):
        runs, errors = [], []
        for ref in references:
            with model._lock:
                forced = teacher_force(backend, ref.prompt, ref.continuation[:-1], p.strategy,
                                       ScriptedPolicy([k] * ref.scored), p.make_predictor)
                river = _kv(backend, len(ref.prompt))
            runs.append((ref, forced))
            if river is not None and ref.kv is not None:
                errors += [relative_error(river[i], ref.kv[i])
                           for i in range(k + 1, backend.num_layers)]
            tick()
        rows.append(LayerRow(k, quality(runs), float(np.mean(errors)) if errors else None))
    return rows


def fit(model: RiverModel, references: Sequence[Reference], config: ExitConfig, target: Target,
        tick: Callable[[], None]) -> tuple[Trial, list[Trial]]:
    """The most permissive value of the policy's tuned option that meets `target` (the strict
    end when none does), and every value tried."""
    name, strict, permissive = tuned_option(model.registry, config)

    def trial(x: float) -> Trial:
        value = strict + x * (permissive - strict)
        tried = attrs.evolve(config, options={**config.options, name: value})
        runs = []
        for ref in references:
            runs.append((ref, model.teacher_force(ref.prompt, ref.continuation[:-1], tried)))
            tick()
        return Trial(value, quality(runs))

    trials = [trial(1.0)]
    best = trials[0] if target.met(trials[0].quality) else None
    lo, hi = 0.0, 1.0
    for _ in range(STEPS if best is None else 0):
        trials.append(trial((lo + hi) / 2))
        if target.met(trials[-1].quality):
            lo, best = (lo + hi) / 2, trials[-1]
        else:
            hi = (lo + hi) / 2
    if best is None:
        trials.append(trial(0.0))
        best = trials[-1]
    return best, trials


def tuned_option(registry, config: ExitConfig) -> tuple[str, float, float]:
    mark = tuned(registry.policy(config.policy))
    if mark is None:
        raise ConfigError(f"policy {config.policy} marks no option for calibration "
                          "(option(..., tune=(strict, permissive)))")
    if mark[0] in config.options:
        raise ConfigError(f"calibration fits {mark[0]}: leave it unset")
    if config.mode != "exit":
        raise ConfigError("calibration fits exit mode; speculative mode is lossless already")
    return mark


def calibrate(model: RiverModel, prompts: Sequence[Sequence[int]], config: ExitConfig,
              targets: Sequence[Target], *, tokens: int = 16, layer_prompts: int = 8,
              model_name: str = "", precision: str = "", source: str = "",
              progress: bool = False) -> list[Profile]:
    """Fit `config`'s policy to each target on `prompts` (token ids): a Profile per target,
    sharing the references and the per-layer table."""
    name = tuned_option(model.registry, config)[0]
    n = model.backend.num_layers
    total = len(prompts) * (1 + (STEPS + 1) * len(targets)) + min(layer_prompts, len(prompts)) * n
    with tqdm(total=total, desc="calibrating", unit="pass", disable=not progress) as bar:
        tick = lambda: bar.update(1)
        bar.set_postfix_str("full depth's continuations")
        references = []
        for prompt in prompts:
            ref = reference(model, prompt, tokens, keep_kv=len(references) < layer_prompts)
            if ref is not None:
                references.append(ref)
            tick()
        if not references:
            raise ConfigError("every prompt's continuation ended at once: nothing to calibrate on")
        bar.set_postfix_str("each exit layer")
        layers = layer_table(model, references[:layer_prompts], config, tick)
        profiles = []
        for target in targets:
            bar.set_postfix_str(f"fitting {name} for {target}")
            best, trials = fit(model, references, config, target, tick)
            profiles.append(Profile(
                model=model_name, fingerprint=fingerprint(model.backend), precision=precision,
                policy=config.policy, options={name: best.value}, target=target,
                quality=best.quality, prompts=f"{len(references)} prompts of {source}",
                tokens=tokens, trials=trials, layers=layers))
        bar.total = bar.n   # prompts that ended at once and early fits take fewer passes
    return profiles
