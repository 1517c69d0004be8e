"""`halfway`: every token leaves after the layer at `fraction` of the depth.

The whole of a third-party exit policy: an options class, a policy with `should_exit`, a
factory that takes the options and the model's depth, and the hook that names it.
"""

import attrs

from river_core.hookspecs import hookimpl
from river_core.options import between, option, takes


@attrs.frozen
class HalfwayOptions:
    fraction: float = option(0.5, "share of the depth a token runs", between(0.0, 1.0))


class Halfway:
    uses_similarity, sub_blocks = False, False   # reads no similarities, no sub-blocks

    def __init__(self, layer: int) -> None:
        self.layer = layer

    def should_exit(self, layer: int, step: int, predictor) -> bool:
        return layer == self.layer


@takes(HalfwayOptions)
def halfway(options: HalfwayOptions, num_layers: int) -> Halfway:
    """Exit every token after the layer at -o fraction=F of the depth (default a half)."""
    return Halfway(min(round(options.fraction * num_layers) - 1, num_layers - 1))


@hookimpl
def river_exit_policies():
    return {"halfway": halfway}
