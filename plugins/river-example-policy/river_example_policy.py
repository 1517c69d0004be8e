"""`halfway`: every token leaves after the layer at `fraction` of the depth.

The whole of a third-party exit policy: an options class, a policy with `should_exit`, a
factory that takes the options and the model's depth, and the hook that names them.
"""

import attrs

from river_core.contract.hookspecs import PolicyPlugin, hookimpl
from river_core.settings.options import between, option
from river_core.method.policy import Policy, RowView


@attrs.frozen
class HalfwayOptions:
    fraction: float = option(0.5, "share of the depth a token runs", between(0.0, 1.0))


class Halfway(Policy):   # needs nothing: no similarities, no sub-blocks, no logits
    def __init__(self, layer: int) -> None:
        self.layer = layer

    def should_exit(self, row: RowView) -> bool:
        return row.layer == self.layer


def halfway(options: HalfwayOptions, num_layers: int) -> Halfway:
    """Exit every token after the layer at -o fraction=F of the depth (default a half)."""
    return Halfway(min(round(options.fraction * num_layers) - 1, num_layers - 1))


@hookimpl
def river_exit_policies():
    return {"halfway": PolicyPlugin(halfway, HalfwayOptions)}
