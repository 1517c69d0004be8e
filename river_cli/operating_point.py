"""The operating point fitted to a model at its first exit-mode call.

Exit mode is worth running only where it beats the whole 4-bit model (every token on the
stand-ins: faster still) on quality and full depth on speed. A threshold fitted on one model
does neither on another (issue 52: tau 0.97, fitted on SmolLM2, exits every token of a 270M
model after layer 3, at the whole 4-bit model's quality). So at a model's first exit-mode call
`river generate`:

0. times the policy's fastest setting (its tuned option's permissive end: the fewest layers
   a token) against full depth on CEILING_PROMPTS questions; where even that is not FASTER,
   no setting is, and nothing is fitted (issue 59: every exit of a 1.5B Q4_K_M on an AVX2 CPU
   decodes below full depth's speed, its Q3_K stand-ins' kernels slower a byte than Q4_K's);
1. fits the policy's tuned option as `river calibrate` fits it (calibrate.py), on the first
   FIT_PROMPTS questions of the bundled GSM8K train slice (never the test slice), to the
   target: by default DEFAULT_TARGET, exit mode recovering at least half of the whole 4-bit
   model's NLL gap over full depth (the paper's claim);
2. checks the fitted value on the next HELD_APART questions, held apart from the fit: its
   agreement and NLL increase against full depth there, against the whole 4-bit model's,
   and against the policy's own default (the paper's tau);
3. times both settings' decode against full depth's (SPEED_PROMPTS questions, interleaved);
4. keeps the result as a profile in the user cache, keyed by the model's content and river
   precision (profile.fingerprint), where every later call finds it.

The point is reached where the fitted value meets the target on the held-apart questions at
least FASTER times full depth's speed. Where it is not, no threshold of this policy is worth
running on this model; `river generate` then runs lossless mode, full depth's own output
(docs/river.md, "The operating point", says why).
"""

from __future__ import annotations

import sys
import time
from typing import Callable, Sequence

import attrs
import numpy as np

from river_core.arguments import default
from river_core.contract.backend import StandIns
from river_core.settings.config import ExitConfig, GenerationConfig
from river_core.settings.errors import ConfigError
from river_core.model import RiverModel
from river_core.settings.options import tuned

from .calibrate import (FULL, calibrate, force, full_depth_references, quality, tuned_option,
                        whole_model)
from .profile import (DEFAULT_TARGET, Measured, Point, Profile, Quality, Target, default_path,
                      fingerprint)
from .prompts import GSM8K_TRAIN, read_prompts

CALIBRATION = GSM8K_TRAIN
SOURCE = "GSM8K train (bundled)"
# sizes that keep a 1.5B model's fit near a minute on 2 cores (issue 59: 406 s at 8, 8, 24,
# 7 and 2 x 32); the fitted value within 1/32 of the policy's range
CONTEXT = 128        # each question's last tokens: the prefill is most of a fit's time
                     # (25 s of 6 byte-level questions of up to 221 tokens, issue 59), and
                     # a chat template's question is shorter under a real tokenizer
FIT_PROMPTS = 6      # the fit's questions: train 0..5
HELD_APART = 4       # the check's: train 6..9
TOKENS = 16          # full depth's continuation scored per question
STEPS = 5            # bisection halvings
SPEED_PROMPTS = 1    # questions each setting decodes for its speed
SPEED_TOKENS = 24
CEILING_PROMPTS = 2  # questions the fastest setting decodes, against full depth, first
SPEED_CONTEXT = 64   # each question's last tokens it decodes after: a step's cost barely
                     # follows a short context, a prefill's does (4 s for 200 tokens, issue 59)
FASTER = 1.05
"""Exit mode's least speed over full depth for the point to count as reached: a smaller gain
does not pay for a lossy output where lossless mode keeps full depth's own."""


def operating_point(model: RiverModel, config: ExitConfig, target: Target | None = None, *,
                    fit: bool = True, progress: bool = False,
                    model_name: str = "", precision: str = "") -> Profile | None:
    """The profile exit mode runs at on this model: the one saved for its content, precision
    and policy (`river calibrate`'s or an earlier first call's), else the one shipped with
    River, else (with `fit`) fitted now and saved. A `target` asks for a profile fitted to it.
    None where nothing is fitted: a backend without stand-ins, a policy without a tuned
    option, that option set by hand, or exit mode refused on this model."""
    if not isinstance(model.backend, StandIns) or config.lossless or \
            not model.registry.kv_strategy(config.kv).make.allows_exit or \
            getattr(model.backend.capabilities, "exit_refused", None):
        return None   # no exits to fit (full depth; exit mode refused: its own line says why)
    mark = tuned(model.registry.policy(config.policy).options)
    if mark is None or mark[0] in config.options:
        return None
    try:
        found = Profile.find(model.backend, config.policy)
    except ConfigError:
        found = None   # a profile of an older format: fitted again, and replaced
    if found is not None and (target is None or found.target == target):
        return found
    if not fit:
        return None
    profile = fit_point(model, config, target or DEFAULT_TARGET, progress=progress,
                        model_name=model_name, precision=precision)
    path = default_path(model.backend, config.policy)
    try:
        profile.save(path)
    except OSError as e:   # a read-only cache: the point still runs, and is fitted next time
        print(f"river: the operating point could not be kept in {path.parent}: {e.strerror}; "
              "the next call fits it again", file=sys.stderr)
    return profile


def fit_point(model: RiverModel, config: ExitConfig, target: Target = DEFAULT_TARGET, *,
              progress: bool = False, model_name: str = "", precision: str = "") -> Profile:
    """Steps 1-3 of the module's description: the fitted profile with its `point`. The
    questions go under the model's chat template where it has one, whatever the call that
    fits asked for itself (`--no-chat`): the point is kept for every later call, and an
    instruct model's raw continuation of a question often ends at once."""
    started = time.perf_counter()
    name = tuned_name(model, config)
    # each question's last tokens where a model's context is short (the generation prompt
    # of a chat template comes last)
    room = min(CONTEXT, model.backend.max_positions - max(TOKENS, SPEED_TOKENS) - 1)
    ids = [q[-room:] for q in model.encode(read_prompts(CALIBRATION, FIT_PROMPTS + HELD_APART))]
    fit_ids, held = ids[:FIT_PROMPTS], ids[FIT_PROMPTS:]
    where = f"{SOURCE}, {FIT_PROMPTS}-{FIT_PROMPTS + HELD_APART - 1}"
    from tqdm import tqdm   # here: its import (0.07 s) is paid only where a bar runs

    with tqdm(total=2 * CEILING_PROMPTS, desc="fitting the exit rule to this model (once)",
              unit="pass", disable=not progress) as bar:
        tick = lambda: bar.update(1)
        # the tuned option's permissive end runs the fewest layers a token, the fastest the
        # policy runs: where even that is not FASTER than full depth, no value is, and the
        # answer is clear before any fit
        bar.set_postfix_str("the fastest setting's speed")
        [ceiling] = speed_over_full(model, held[:CEILING_PROMPTS], [fastest(model, config)],
                                    tick)
        if ceiling < FASTER:
            return unreachable(model, config, target, ceiling,
                               f"{CEILING_PROMPTS} questions of {where}", started, model_name,
                               precision)
        [profile] = calibrate(model, fit_ids, config, [target], tokens=TOKENS, layer_prompts=0,
                              model_name=model_name, precision=precision,
                              source=f"{SOURCE}, questions 0-{FIT_PROMPTS - 1}", bar=bar,
                              steps=STEPS, hopeless=too_slow(model.backend))
        bar.total += 4 * len(held) + (1 + 2) * SPEED_PROMPTS
        bar.refresh()
        bar.set_postfix_str("held-apart questions")
        refs = full_depth_references(model, held, TOKENS, 0, tick)
        if not refs:
            raise ConfigError("every held-apart question's continuation ended at once")
        fitted = profile.exit_config(config)
        paper = attrs.evolve(config, options={
            **config.options, name: default(model.registry.policy(config.policy).options, name)})
        whole = whole_model(model, refs, config, tick)
        qualities = [quality(force(model, refs, c, tick)[0]) for c in (fitted, paper)]
        bar.set_postfix_str("speed against full depth")
        speeds = speed_over_full(model, held[:SPEED_PROMPTS], [fitted, paper], tick)
        bar.total = bar.n
        bar.refresh()
    measured = [Measured(c.options[name], q, s) for c, q, s in zip((fitted, paper), qualities,
                                                                   speeds)]
    reached = profile.met and target.met(measured[0].quality, whole) and speeds[0] >= FASTER
    point = Point(prompts=f"{len(refs)} questions of {where}", whole_model=whole,
                  fitted=measured[0], default=measured[1], reached=reached,
                  seconds=time.perf_counter() - started, ceiling=ceiling)
    return attrs.evolve(profile, point=point)


def fastest(model: RiverModel, config: ExitConfig) -> ExitConfig:
    """`config` at its policy's tuned option's permissive end: the fewest layers a token."""
    name, _, permissive = tuned_option(model.registry, config)
    return attrs.evolve(config, options={**config.options, name: permissive})


def unreachable(model: RiverModel, config: ExitConfig, target: Target, ceiling: float,
                prompts: str, started: float, model_name: str, precision: str) -> Profile:
    """The profile of a model on which exit mode cannot pay: nothing fitted, the fastest exit
    mode's speed (`ceiling`) kept as the reason."""
    point = Point(prompts=prompts, whole_model=None, fitted=None, default=None, reached=False,
                  seconds=time.perf_counter() - started, ceiling=ceiling)
    return Profile(model=model_name, fingerprint=fingerprint(model.backend),
                   precision=precision, policy=config.policy, options={}, target=target,
                   quality=None, prompts="none: exit mode cannot pay", tokens=0, trials=(),
                   layers=(), point=point)


def too_slow(backend) -> Callable[[Quality], bool] | None:
    """Whether a threshold whose tokens run `quality.mean_layers` layers could not reach
    FASTER times full depth's speed even at the byte limit (the bytes full depth reads a token
    over those its exits read: real kernels do no better), so a stricter one, which runs more
    layers, could not either: the fit stops there. None where the engine reports no
    footprint."""
    footprint = getattr(backend, "footprint", None)
    if footprint is None:
        return None
    foot, n = footprint(), backend.num_layers
    full = foot.bytes_per_token(n - 1, 0)

    def slow(quality: Quality) -> bool:
        k = min(max(quality.mean_layers - 1, -1), n - 1)   # the mean exit layer
        below, share = int(np.floor(k)), k - np.floor(k)
        exits = foot.bytes_per_token(below, 0) if share == 0 else \
            (1 - share) * foot.bytes_per_token(below, 0) + \
            share * foot.bytes_per_token(min(below + 1, n - 1), 0)
        return full / exits < FASTER
    return slow


def tuned_name(model: RiverModel, config: ExitConfig) -> str:
    mark = tuned(model.registry.policy(config.policy).options)
    if mark is None:
        raise ConfigError(f"policy {config.policy} marks no option to fit")
    return mark[0]


def speed_over_full(model: RiverModel, prompts: Sequence[Sequence[int]],
                    configs: Sequence[ExitConfig], tick: Callable[[], None]) -> list[float]:
    """Each setting's decode speed over full depth's: full depth's ms/token over its own.
    Every prompt decodes under full depth and each setting in turn, so a shared machine's
    drift hits all alike, after an untimed short decode of each (an engine's first use of a
    setting builds what it runs)."""
    settings = [FULL, *configs]
    prompts = [p[-SPEED_CONTEXT:] for p in prompts]
    for c in settings:
        model.generate_ids([prompts[0]], c, GenerationConfig(max_new_tokens=4))
    seconds, tokens = [0.0] * len(settings), [0] * len(settings)
    for prompt in prompts:
        for i, c in enumerate(settings):
            out = model.generate_ids([prompt], c, GenerationConfig(max_new_tokens=SPEED_TOKENS))
            seconds[i] += sum(out.step_seconds)
            tokens[i] += out.decoded_tokens
            tick()
    ms = [s / max(n, 1) for s, n in zip(seconds, tokens)]
    return [ms[0] / m if m > 0 else 0.0 for m in ms[1:]]


def chosen(profile: Profile, config: ExitConfig, lossless: ExitConfig) -> ExitConfig:
    """What runs: exit mode at the profile's fitted value, or `lossless` where the point was
    not reached."""
    if profile.point is not None and not profile.point.reached:
        return lossless
    return profile.exit_config(config)


def _tuned(profile: Profile) -> tuple[str, float, float]:
    """The profile's policy's tuned option: its name, strict and permissive ends."""
    from river_core.plugins import default_registry

    return tuned(default_registry().policy(profile.policy).options)


def _cannot_pay(profile: Profile) -> str:
    name, _, permissive = _tuned(profile)
    return (f"its fastest setting ({name}={permissive:g}, the fewest layers a token) decodes at "
            f"{profile.point.ceiling:.2f}x full depth's speed, below {FASTER:g}x")


def _short(profile: Profile, num_layers: int) -> str:
    point, name = profile.point, _tuned(profile)[0]
    if point.fitted is None:
        return (f"river: lossless mode (full depth's own output): exit mode cannot pay on this "
                f"model here: {_cannot_pay(profile)} (measured once; --verbose for more)")
    if point.reached:
        m = point.fitted
        return (f"river: exit mode at {name}={m.value:.4g}, fitted to this model "
                f"({m.quality.mean_layers:.1f} of {num_layers} layers a token, {m.speed:.2f}x "
                f"full depth's speed; --verbose for its quality)")
    return (f"river: lossless mode (full depth's own output): on this model exit mode does not "
            f"meet {profile.target} at {FASTER:g}x full depth's speed (fitted once; --verbose "
            f"for the figures; -o {name}={point.default.value:g} runs the policy's default)")


def _gap(q: Quality, whole: Quality) -> str:
    share = q.recovered(whole)
    return "no gap to recover" if share is None else f"{100 * share:.0f}% of the gap recovered"


def not_fitted(model: str | None) -> str:
    """The line a call on a model without an operating point prints."""
    named = f" --model {model}" if model else ""
    return (f"river: lossless mode (full depth's own output, n-gram drafts): no operating "
            f"point fitted to this model yet; `river fit{named}` fits exit mode once, or "
            f"--mode exit fits it at first use")


def describe(profile: Profile, num_layers: int, verbose: bool = False) -> str:
    """The line `river generate` prints of the point it runs at: the mode, why, how to change
    it; with `verbose` every figure."""
    point = profile.point
    if point is None:
        return f"calibrated: {profile.describe()}"
    if not verbose:
        return _short(profile, num_layers)
    name = _tuned(profile)[0]
    if point.fitted is None:
        return (f"operating point: exit mode cannot pay on this model on this machine: "
                f"{_cannot_pay(profile)}, measured once, in {point.seconds:.0f} s, on "
                f"{point.prompts}; so nothing was fitted and River runs lossless mode: full "
                f"depth's own output (--mode speculative). Other choices: --mode exit -o "
                f"{name}=VALUE runs exit mode at a value of your own; --no-profile for the "
                f"policy's defaults")
    whole = point.whole_model

    def figures(m: Measured) -> str:
        q = m.quality
        return (f"{q.mean_layers:.1f} of {num_layers} layers a token, agreement "
                f"{q.agreement:.3f}, NLL {q.nll_delta:+.3f} ({_gap(q, whole)}), {m.speed:.2f}x "
                f"full depth's speed")

    setting = lambda m: f"{name}={m.value:.4g}: {figures(m)}"

    where = (f"on {point.prompts} (the whole 4-bit model: agreement "
             f"{whole.agreement:.3f}, NLL {whole.nll_delta:+.3f} nats/token over full depth)")
    if point.reached:
        return (f"operating point ({profile.target}, fitted to this model once, in "
                f"{point.seconds:.0f} s): {profile.policy} {setting(point.fitted)} {where}")
    return (f"operating point: no {profile.policy} {name} meets {profile.target} at "
            f"{FASTER:g}x full depth's speed or more on this model (fitted once, in "
            f"{point.seconds:.0f} s, "
            f"{setting(point.fitted)} {where}), so River runs lossless mode: full depth's own "
            f"output (--mode speculative). Other choices: -o {name}={point.default.value:g}, "
            f"the policy's default ({figures(point.default)}); --target "
            f"for another target; --no-profile for the policy's defaults")
