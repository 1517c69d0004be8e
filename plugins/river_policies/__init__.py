"""Exit-policy plugins that ship with River, registered like any third-party plugin."""

import attrs
import numpy as np

from river_core.errors import ConfigError
from river_core.hookspecs import hookimpl
from river_core.options import at_least, between, option, takes
from river_core.policy import SettledPolicy, check_min_layer


class FixedDepth:
    """Every token leaves after the same layer (a static depth baseline; handy for tests)."""

    uses_similarity, sub_blocks = False, False

    def __init__(self, layer: int) -> None:
        self.layer = layer

    def should_exit(self, layer, step, predictor) -> bool:
        return layer == self.layer


@attrs.frozen
class FixedOptions:
    layer: int | None = option(None, "the exit layer; -1: before the first layer (the whole "
                               "model quantized)")


@takes(FixedOptions)
def fixed(options: FixedOptions, num_layers: int) -> FixedDepth:
    """Exit every token after layer `layer` (-o layer=K; -1: the whole model quantized)."""
    if not isinstance(options.layer, int) or not -1 <= options.layer < num_layers:
        raise ConfigError(f"the fixed policy needs a layer in [-1, {num_layers - 1}], "
                          f"got {options.layer}")
    return FixedDepth(options.layer)


class Cascade(SettledPolicy):
    """The paper's rule, then a second look: a token whose river output is unsure (the top
    token's probability beats the runner-up's by less than `margin`) goes back through the
    backbone from its exit, overwriting the river's K/V there."""

    rechecks = True

    def __init__(self, tau: float, min_layer: int, margin: float) -> None:
        super().__init__(tau, min_layer)
        self.margin = margin

    def recheck(self, logits: np.ndarray) -> bool:
        z = logits.astype(np.float64)
        top2 = np.partition(z, -2)[-2:]
        p = np.exp(top2 - z.max()) / np.exp(z - z.max()).sum()
        return float(p[1] - p[0]) < self.margin


@attrs.frozen
class CascadeOptions:
    tau: float = option(0.97, "exit once both sub-blocks' input/output cosine exceed this",
                        between(-1.0, 1.0))
    min_layer: int = option(1, "earliest layer a token may exit after", at_least(0))
    margin: float = option(0.3, "recompute at full depth when the river's top-1 probability "
                           "beats the runner-up's by less than this", between(0.0, 1.0))


@takes(CascadeOptions)
def cascade(options: CascadeOptions, num_layers: int) -> Cascade:
    """The paper's rule; unsure river outputs (top-1 margin < margin) rerun the backbone."""
    return Cascade(options.tau, check_min_layer(options.min_layer, num_layers), options.margin)


@hookimpl
def river_exit_policies():
    return {"fixed": fixed, "cascade": cascade}
