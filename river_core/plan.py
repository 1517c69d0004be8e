"""Resolve once: from an `ExitConfig` (names and options) to a typed, immutable `Plan`.

`resolve` binds each chosen plugin's options, makes the exit policy for the model's depth and
checks the whole against the backend's capabilities. It needs no loaded model, only the
backend's declared capabilities and the model's shape, so the CLI resolves before a long load
and hands the plan to the model; `RiverModel` resolves the same way from a loaded backend.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Mapping

import attrs

from .contract.backend import Capabilities, ModelShape
from .settings.config import DRAFT_WINDOW, ExitConfig
from .loop.decode import Run
from .method.draft_length import DraftLength
from .settings.errors import CapabilityError, ConfigError
from .contract.hookspecs import KVStrategyPlugin, PredictorPlugin
from .settings.options import bind
from .plugins import Registry
from .method.policy import ExitPolicy

if TYPE_CHECKING:   # a type only: the plan does not import the loop
    from .loop.speculative import DraftSource


@attrs.frozen
class Plan:
    """What a generation runs, resolved and checked. Policies keep no state of their own, so the
    plan holds the made policy; KV strategies and predictors may keep state, so it makes them
    afresh for every generation (`run`)."""

    config: ExitConfig
    backend: str
    shape: ModelShape
    policy: ExitPolicy
    kv_plugin: KVStrategyPlugin       # the entry; `run()` makes a live strategy from it
    kv_options: Any
    predictor_plugin: PredictorPlugin
    predictor_options: Any
    draft_window: int | None = None   # the config's, or the default where the backend windows
    draft_sources: Mapping[str, DraftSource] = {}   # speculative mode: by name, made from
                                                    # their options

    def run(self) -> Run:
        return Run(self.kv_plugin.make(self.kv_options), self.policy,
                   functools.partial(self.predictor_plugin.make, self.predictor_options),
                   self.config.step_aside_above, self.draft_window,
                   self.config.stand_in_head)

    def draft_length(self) -> DraftLength:
        """Speculative mode's draft length rule, fresh for a generation."""
        return DraftLength({name: s.most or self.config.draft_tokens
                            for name, s in self.draft_sources.items()}, self.config.adaptive,
                           {name for name, s in self.draft_sources.items()
                            if getattr(s, "sizes_drafts", False)})


def resolve(config: ExitConfig, registry: Registry, capabilities: Capabilities,
            shape: ModelShape, backend: str) -> Plan:
    """The plugins `config` names, with their options bound and checked against the backend's
    capabilities and the model's shape."""
    policy, kv, predictor = (registry.policy(config.policy), registry.kv_strategy(config.kv),
                             registry.predictor(config.predictor))
    sources = {name: registry.draft_source(name) for name in config.drafts} \
        if config.lossless else {}
    options = bind(config.options, {"policy": policy.options, "predictor": predictor.options,
                                    "kv_strategy": kv.options}
                   | {f"drafts {name}": s.options for name, s in sources.items()})
    made = policy.make(options["policy"], shape.num_layers)
    _check(config, kv.make, made, capabilities, shape, backend)
    unused = sorted(set(predictor.across_tokens) & set(config.options))
    if unused and kv.make.allows_exit and not capabilities.sequences:
        raise ConfigError(f"backend {backend!r} keeps no state per sequence (each token's "
                          f"predictor starts afresh every step), so {', '.join(unused)} of "
                          f"the {config.predictor!r} predictor would have no effect")
    window = config.draft_window
    if window is None and config.lossless and capabilities.windowed_drafts:
        window = DRAFT_WINDOW
    made_sources = {name: s.make(options[f"drafts {name}"]) for name, s in sources.items()}
    return Plan(config, backend, shape, made, kv, options["kv_strategy"], predictor,
                options["predictor"], window, made_sources)


def check_exits_allowed(config: ExitConfig, strategy, caps: Capabilities) -> None:
    """Exit mode where the loaded model refuses it (its stand-ins cannot sit below its
    backbone): its reason, in one line. Checked again once the model is loaded, for a plan
    resolved before (the model's own capabilities are known only then)."""
    if strategy.allows_exit and not config.lossless and caps.exit_refused:
        raise CapabilityError(caps.exit_refused)


def _check(config: ExitConfig, strategy, policy: ExitPolicy, caps: Capabilities,
           shape: ModelShape, backend: str) -> None:
    needs = policy.needs
    if strategy.allows_exit and not caps.exits:
        raise CapabilityError(f"backend {backend!r} cannot exit early; use kv strategy 'full'")
    check_exits_allowed(config, strategy, caps)
    if strategy.requires and not getattr(caps, strategy.requires):
        raise CapabilityError(f"backend {backend!r} does not support the {config.kv!r} kv "
                              f"strategy")
    if strategy.allows_exit and needs.sub_blocks and not caps.sub_blocks:
        raise CapabilityError(f"the {config.policy!r} policy reads sub-block similarities, "
                              f"which backend {backend!r} does not report")
    if strategy.allows_exit and needs.recheck and not strategy.drafts:
        raise ConfigError(f"the {config.policy!r} policy recomputes doubtful tokens through "
                          f"the backbone, which the {config.kv!r} kv strategy cannot take "
                          f"(river or propagate can)")
    if strategy.allows_exit and needs.recheck and not caps.rerun:
        raise CapabilityError(f"the {config.policy!r} policy reruns doubtful tokens through "
                              f"the backbone after a step, which backend {backend!r} cannot")
    if strategy.across_steps and not caps.sequences:
        raise CapabilityError(f"the {config.kv!r} kv strategy keeps state per sequence, which "
                              f"backend {backend!r} cannot give it (it sees tokens, not "
                              f"sequences)")
    if strategy.allows_exit and not caps.sequences and policy.new_row() is not None:
        raise CapabilityError(f"the {config.policy!r} policy keeps state per sequence, which "
                              f"backend {backend!r} cannot give it (it sees tokens, not "
                              f"sequences)")
    if config.prefill_exit is not None:
        if strategy.skipped_reads != "stand_in":
            raise ConfigError(f"prefill_exit runs the prompt's deep layers as stand-ins; the "
                              f"{config.kv!r} kv strategy has none")
        if config.prefill_exit >= shape.num_layers:
            raise ConfigError(f"prefill_exit {config.prefill_exit} is past the model's last "
                              f"layer ({shape.num_layers - 1})")
    if config.stand_in_head:
        if config.lossless:
            raise ConfigError("exit_head is the head of exit mode's exited tokens: speculative "
                              "mode's drafts take the head's stand-in, its output the model's "
                              "own head")
        if not caps.stand_in:
            raise CapabilityError(f"backend {backend!r} has no stand-in for the head; use "
                                  f"exit_head 'backbone'")
    if config.draft_window is not None and not config.lossless:
        raise ConfigError("draft_window is the drafts' attention window: it applies to "
                          "speculative mode")
    if config.lossless:
        _check_can_draft(caps, backend, strategy, config.draft_window)
        if config.prefill_exit is not None:
            raise ConfigError("speculative mode is lossless, but prefill_exit would leave "
                              "stand-in K/V in the prompt's slots; drop one of them")


def _check_can_draft(caps: Capabilities, backend_name: str, strategy,
                     draft_window: int | None) -> None:
    if not caps.verify:
        raise CapabilityError(f"backend {backend_name!r} cannot verify drafts (extend); "
                              f"speculative mode needs it")
    if not strategy.drafts:
        raise ConfigError(f"the {strategy.name!r} kv strategy cannot draft: speculative mode "
                          f"needs every draft step to write its slots and no state across "
                          f"steps (river, propagate or full)")
    if draft_window is not None and not caps.windowed_drafts:
        raise CapabilityError(f"backend {backend_name!r} cannot give drafts a window of the "
                              f"context; leave draft_window unset")
