"""The core's own plugin: the method's policy, predictor and KV strategies.

Registered through the `river_core` entry-point group exactly like a third-party plugin.
"""

from __future__ import annotations

from .config import ExitConfig
from .errors import ConfigError
from .hookspecs import hookimpl
from .kv import Full, Mask, Monotonic, Propagate, Recompute, River
from .policy import SimilarityPolicy
from .predictor import TransitionPredictor


def similarity_policy(config: ExitConfig, num_layers: int) -> SimilarityPolicy:
    """Exit at the first layer whose predicted cumulative KV error is <= threshold."""
    min_layer = num_layers // 4 if config.min_layer is None else config.min_layer
    if min_layer >= num_layers:
        raise ConfigError(f"min_layer {min_layer} is past the model's last layer "
                          f"({num_layers - 1})")
    return SimilarityPolicy(config.threshold, min_layer)


def transition_predictor(river_error, prompt_similarity) -> TransitionPredictor:
    """First-order river error model over block transitions sqrt(2 - 2 cos)."""
    return TransitionPredictor(river_error, prompt_similarity)


@hookimpl
def river_exit_policies():
    return {"similarity": similarity_policy}


@hookimpl
def river_predictors():
    return {"transition": transition_predictor}


@hookimpl
def river_kv_strategies():
    return {"river": River, "propagate": Propagate, "monotonic": Monotonic,
            "mask": Mask, "recompute": Recompute, "full": Full}
