"""`cascade`: the paper's rule, and a second look at unsure river outputs."""

import attrs
import numpy as np

from river_core.options import at_least, between, option, takes
from river_core.policy import SettledPolicy, check_min_layer

from .signals import margin


class Cascade(SettledPolicy):
    """The paper's rule, then a second look: a token whose river output is unsure (the top
    token's probability beats the runner-up's by less than `margin`) goes back through the
    backbone from its exit, overwriting the river's K/V there."""

    rechecks = True

    def __init__(self, tau: float, min_layer: int, margin: float) -> None:
        super().__init__(tau, min_layer)
        self.margin = margin

    def recheck(self, logits: np.ndarray) -> bool:
        return margin(logits) < self.margin


@attrs.frozen
class CascadeOptions:
    tau: float = option(0.97, "exit once both sub-blocks' input/output cosine exceed this",
                        between(-1.0, 1.0))
    min_layer: int = option(1, "earliest layer a token may exit after", at_least(0))
    margin: float = option(0.3, "recompute at full depth when the river's top-1 probability "
                           "beats the runner-up's by less than this", between(0.0, 1.0),
                           tune=(1.0, 0.0))


@takes(CascadeOptions)
def cascade(options: CascadeOptions, num_layers: int) -> Cascade:
    """The paper's rule; unsure river outputs (top-1 margin < margin) rerun the backbone."""
    return Cascade(options.tau, check_min_layer(options.min_layer, num_layers), options.margin)
