"""Exit policies: per decoding token and layer, does the token leave the backbone now?"""

from __future__ import annotations

from typing import Protocol

import attrs

from .errors import ConfigError
from .options import at_least, between, option
from .predictor import SimilarityPredictor


def check_min_layer(min_layer: int, num_layers: int) -> int:
    if min_layer >= num_layers:
        raise ConfigError(f"min_layer {min_layer} is past the model's last layer "
                          f"({num_layers - 1})")
    return min_layer


class ExitPolicy(Protocol):
    uses_similarity: bool
    """True when `should_exit` reads the predictor (the core then measures transitions)."""
    sub_blocks: bool
    """True when the predictor should observe, per backbone layer, the smaller of its attention
    and MLP sub-blocks' input/output cosines instead of the whole block's (the backend must
    declare `Capabilities.sub_blocks`)."""

    def should_exit(self, layer: int, step: int, predictor: SimilarityPredictor) -> bool:
        """After backbone layer `layer` of the `step`-th generated token: exit now?"""

    # Optional, for confidence rules (CALM): a policy with `reads_logits = True` is called as
    #     should_exit(layer, step, predictor, logits)
    # where logits() returns the token's [vocab] logits of its state after `layer` (the final
    # norm and LM head: a head-sized matmul, made on the first call at that layer).
    #
    # Optional, for a cascade: a policy with `rechecks = True` also has
    #     def recheck(self, logits: np.ndarray) -> bool
    # called with an exited token's [vocab] logits from the river: True sends the token back
    # through the backbone from its exit layer, whose K/V then overwrite the river's, and
    # its logits become full depth's (only with strategies that can draft: river, propagate).


@attrs.frozen
class SimilarityOptions:
    threshold: float = option(0.15, "largest predicted cumulative KV error a token may exit "
                              "with", between(0.0, 10.0), tune=(0.0, 5.0))
    min_layer: int | None = option(None, "earliest layer a token may exit after (default: a "
                                   "quarter of the depth)", at_least(0))


class SimilarityPolicy:
    """River's policy: leave at the first layer >= min_layer whose predicted error fits."""

    uses_similarity, sub_blocks = True, False

    def __init__(self, threshold: float, min_layer: int) -> None:
        self.threshold = threshold
        self.min_layer = min_layer

    def should_exit(self, layer: int, step: int, predictor: SimilarityPredictor) -> bool:
        return layer >= self.min_layer and predictor.predicted_error(layer) <= self.threshold


@attrs.frozen
class SettledOptions:
    tau: float = option(0.97, "exit once both sub-blocks' input/output cosine exceed this",
                        between(-1.0, 1.0), tune=(1.0, 0.5))
    min_layer: int = option(1, "earliest layer a token may exit after", at_least(0))


class SettledPolicy:
    """The paper's rule: leave after the first layer >= min_layer whose attention and MLP
    sub-blocks both keep the state's direction, cos(input, output) > tau."""

    uses_similarity, sub_blocks = True, True

    def __init__(self, tau: float, min_layer: int) -> None:
        self.tau = tau
        self.min_layer = min_layer

    def should_exit(self, layer: int, step: int, predictor: SimilarityPredictor) -> bool:
        return layer >= self.min_layer and predictor.last > self.tau
