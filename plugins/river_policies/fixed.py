"""`fixed`: every token leaves after the same layer."""

import attrs

from river_core.settings.errors import ConfigError
from river_core.settings.options import option
from river_core.method.policy import Policy, RowView


class FixedDepth(Policy):
    """Every token leaves after the same layer (a static depth baseline; handy for tests)."""

    def __init__(self, layer: int) -> None:
        self.layer = layer

    def should_exit(self, row: RowView) -> bool:
        return row.layer == self.layer


@attrs.frozen
class FixedOptions:
    layer: int | None = option(None, "the exit layer; -1: before the first layer (the whole "
                               "model quantized)")


def fixed(options: FixedOptions, num_layers: int) -> FixedDepth:
    """Exit every token after layer `layer` (-o layer=K; -1: the whole model quantized)."""
    if not isinstance(options.layer, int) or not -1 <= options.layer < num_layers:
        raise ConfigError(f"the fixed policy needs a layer in [-1, {num_layers - 1}], "
                          f"got {options.layer}")
    return FixedDepth(options.layer)
