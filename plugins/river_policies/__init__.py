"""Exit-policy plugins that ship with River, registered like any third-party plugin."""

from river_core.config import ExitConfig
from river_core.errors import ConfigError
from river_core.hookspecs import hookimpl


class FixedDepth:
    """Every token leaves after the same layer (a static depth baseline; handy for tests)."""

    uses_similarity = False

    def __init__(self, layer: int) -> None:
        self.layer = layer

    def should_exit(self, layer, step, predictor) -> bool:
        return layer == self.layer


def fixed(config: ExitConfig, num_layers: int) -> FixedDepth:
    """Exit every token after layer `layer` (--layer; -1: the whole model quantized)."""
    if config.layer is None or not -1 <= config.layer < num_layers:
        raise ConfigError(f"the fixed policy needs a layer in [-1, {num_layers - 1}], "
                          f"got {config.layer}")
    return FixedDepth(config.layer)


@hookimpl
def river_exit_policies():
    return {"fixed": fixed}
