"""`cascade`: the paper's rule, and a second look at unsure river outputs."""

import attrs
import numpy as np

from river_core.settings.options import between, option
from river_core.method.policy import Needs, SettledOptions, SettledPolicy

from .signals import margin


@attrs.frozen
class CascadeOptions(SettledOptions):
    margin: float = option(0.3, "recompute at full depth when the river's top-1 probability "
                           "beats the runner-up's by less than this", between(0.0, 1.0),
                           tune=(1.0, 0.0))


class Cascade(SettledPolicy):
    """The paper's rule; unsure river outputs (top-1 margin < margin) rerun the backbone.

    A token whose river output is unsure (the top token's probability beats the runner-up's
    by less than `margin`) goes back through the backbone from its exit, overwriting the
    river's K/V there."""

    needs = Needs(similarity=True, sub_blocks=True, recheck=True)

    def __init__(self, options: CascadeOptions, num_layers: int) -> None:
        super().__init__(options, num_layers)
        self.margin = options.margin

    def recheck(self, logits: np.ndarray) -> bool:
        return margin(logits) < self.margin
