"""The core's own plugin: the method's policies, predictor, KV strategies and draft sources.

Registered in code before any entry point loads (so a source checkout has them), through the
same hooks as any third-party plugin.
"""

from __future__ import annotations

import attrs

from .contract.hookspecs import (DraftSourcePlugin, KVStrategyPlugin, PolicyPlugin, PredictorPlugin,
                                 hookimpl)
from .loop.ngram import NgramOptions, NgramSource
from .method.kv import Full, Mask, Monotonic, Propagate, Recompute, River
from .settings.options import between, option
from .method.policy import SettledOptions, SettledPolicy, SimilarityOptions, SimilarityPolicy
from .method.predictor import TransitionPredictor
from .loop.speculative import RiverSource


@attrs.frozen
class TransitionOptions:
    momentum: float = option(0.9, "weight of the past in the running mean of each block's "
                             "transition", between(0.0, 1.0))


def transition_predictor(options: TransitionOptions, stand_in_error,
                         prompt_similarity) -> TransitionPredictor:
    """First-order stand-in error model over block transitions sqrt(2 - 2 cos)."""
    return TransitionPredictor(stand_in_error, prompt_similarity, options.momentum)


@hookimpl
def river_exit_policies():
    return {"similarity": PolicyPlugin(SimilarityPolicy, SimilarityOptions),
            "settled": PolicyPlugin(SettledPolicy, SettledOptions)}


@hookimpl
def river_predictors():
    return {"transition": PredictorPlugin(transition_predictor, TransitionOptions,
                                          across_tokens=("momentum",))}


@hookimpl
def river_kv_strategies():
    return {s.name: KVStrategyPlugin(s) for s in (River, Propagate, Monotonic, Mask, Recompute,
                                                  Full)}


def river_drafts(options) -> RiverSource:
    """Drafts from the exit river: decode steps under the exit policy (a model cost)."""
    return RiverSource()


def ngram_drafts(options: NgramOptions) -> NgramSource:
    """Drafts what followed the context's last tokens where they occurred before (free)."""
    return NgramSource(options)


@hookimpl
def river_draft_sources():
    return {"river": DraftSourcePlugin(river_drafts),
            "ngram": DraftSourcePlugin(ngram_drafts, NgramOptions)}
