"""Exit policies: per decoding token and layer, does the token leave the backbone now?"""

from __future__ import annotations

from typing import Protocol

import attrs

from .options import at_least, between, option
from .predictor import SimilarityPredictor


class ExitPolicy(Protocol):
    uses_similarity: bool
    """True when `should_exit` reads the predictor (the core then measures transitions)."""

    def should_exit(self, layer: int, step: int, predictor: SimilarityPredictor) -> bool:
        """After backbone layer `layer` of the `step`-th generated token: exit now?"""


@attrs.frozen
class SimilarityOptions:
    threshold: float = option(0.15, "largest predicted cumulative KV error a token may exit "
                              "with", between(0.0, 10.0))
    min_layer: int | None = option(None, "earliest layer a token may exit after (default: a "
                                   "quarter of the depth)", at_least(0))


class SimilarityPolicy:
    """River's policy: leave at the first layer >= min_layer whose predicted error fits."""

    uses_similarity = True

    def __init__(self, threshold: float, min_layer: int) -> None:
        self.threshold = threshold
        self.min_layer = min_layer

    def should_exit(self, layer: int, step: int, predictor: SimilarityPredictor) -> bool:
        return layer >= self.min_layer and predictor.predicted_error(layer) <= self.threshold
