"""The core's own plugin: the method's policy, predictor and KV strategies.

Registered in code before any entry point loads (so a source checkout has them), through the
same hooks as any third-party plugin.
"""

from __future__ import annotations

import attrs

from .hookspecs import hookimpl
from .kv import Full, Mask, Monotonic, Propagate, Recompute, River
from .options import between, option, takes
from .policy import (SettledOptions, SettledPolicy, SimilarityOptions, SimilarityPolicy,
                     check_min_layer)
from .predictor import TransitionPredictor


@takes(SimilarityOptions)
def similarity_policy(options: SimilarityOptions, num_layers: int) -> SimilarityPolicy:
    """Exit at the first layer whose predicted cumulative KV error is <= threshold."""
    min_layer = num_layers // 4 if options.min_layer is None else options.min_layer
    return SimilarityPolicy(options.threshold, check_min_layer(min_layer, num_layers))


@takes(SettledOptions)
def settled_policy(options: SettledOptions, num_layers: int) -> SettledPolicy:
    """The paper's rule: exit once attention and MLP both have cos(input, output) > tau."""
    return SettledPolicy(options.tau, check_min_layer(options.min_layer, num_layers))


@attrs.frozen
class TransitionOptions:
    momentum: float = option(0.9, "weight of the past in the running mean of each block's "
                             "transition", between(0.0, 1.0))


@takes(TransitionOptions)
def transition_predictor(options: TransitionOptions, stand_in_error,
                         prompt_similarity) -> TransitionPredictor:
    """First-order stand-in error model over block transitions sqrt(2 - 2 cos)."""
    return TransitionPredictor(stand_in_error, prompt_similarity, options.momentum)


@hookimpl
def river_exit_policies():
    return {"similarity": similarity_policy, "settled": settled_policy}


@hookimpl
def river_predictors():
    return {"transition": transition_predictor}


@hookimpl
def river_kv_strategies():
    return {"river": River, "propagate": Propagate, "monotonic": Monotonic,
            "mask": Mask, "recompute": Recompute, "full": Full}
