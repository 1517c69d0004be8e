"""`confidence` (CALM's softmax margin) and `entropy`: exit once the state, read through the
final norm and LM head, already names its token clearly. Each reading costs a head-sized
matmul per layer where a token may exit, which a large vocabulary makes dear."""

import attrs

from river_core.errors import ConfigError
from river_core.options import at_least, between, option, takes
from river_core.policy import check_min_layer

from .signals import entropy, margin


@attrs.frozen
class Layers:
    """Where a policy may let tokens out."""

    min_layer: int
    allowed: frozenset[int] | None   # None: any layer from min_layer on

    @classmethod
    def of(cls, min_layer: int, layers, num_layers: int) -> "Layers":
        check_min_layer(min_layer, num_layers)
        if layers is not None and (not isinstance(layers, (list, tuple)) or not all(
                isinstance(k, int) and -1 <= k < num_layers - 1 for k in layers)):
            raise ConfigError(f"layers must be a list of exit layers in [-1, {num_layers - 2}], "
                              f"e.g. -o layers=[3,7,11]; got {layers!r}")
        return cls(min_layer, None if layers is None else frozenset(layers))

    def open(self, layer: int) -> bool:
        return layer >= self.min_layer and (self.allowed is None or layer in self.allowed)


class Confident:
    """Exit after the first open layer where `score(logits)` passes `threshold`."""

    uses_similarity, sub_blocks, reads_logits = False, False, True

    def __init__(self, layers: Layers, passes) -> None:
        self.layers, self.passes = layers, passes

    def should_exit(self, layer, step, predictor, logits) -> bool:
        return self.layers.open(layer) and self.passes(logits())   # reads only where open


@attrs.frozen
class WhereOptions:
    """Where a policy may let tokens out: the options every policy here shares."""

    min_layer: int = option(1, "earliest layer a token may exit after", at_least(-1))
    layers: list | None = option(None, "exit only after these layers, e.g. [3,7,11] "
                                 "(default: any)")

    def where(self, num_layers: int) -> Layers:
        return Layers.of(self.min_layer, self.layers, num_layers)


@attrs.frozen
class ConfidenceOptions(WhereOptions):
    threshold: float = option(0.9, "exit once the top token's probability beats the "
                              "runner-up's by this much", between(0.0, 1.0), tune=(1.0, 0.0))


@takes(ConfidenceOptions)
def confidence(options: ConfidenceOptions, num_layers: int) -> Confident:
    """CALM: exit once the early softmax's top-1 margin >= threshold (a head matmul a layer)."""
    return Confident(options.where(num_layers),
                     lambda logits: margin(logits) >= options.threshold)


@attrs.frozen
class EntropyOptions(WhereOptions):
    threshold: float = option(1.0, "exit once the early softmax's entropy (nats) is at most "
                              "this", between(0.0, 100.0), tune=(0.0, 8.0))


@takes(EntropyOptions)
def entropy_policy(options: EntropyOptions, num_layers: int) -> Confident:
    """Exit once the early softmax's entropy <= threshold nats (a head matmul a layer)."""
    return Confident(options.where(num_layers),
                     lambda logits: entropy(logits) <= options.threshold)
