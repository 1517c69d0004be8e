"""`confidence` (CALM's softmax margin) and `entropy`: exit once the state, read through the
final norm and LM head, already names its token clearly. Each reading costs a head-sized
matmul per layer where a token may exit, which a large vocabulary makes dear."""

from typing import Callable

import attrs
import numpy as np

from river_core.settings.options import between, option
from river_core.method.policy import Exits, Policy, RowView, WhereOptions

from .signals import entropy, margin


class Confident(Policy):
    """Exit after the first open layer where `passes(logits)`."""

    def __init__(self, exits: Exits, passes: Callable[[np.ndarray], bool]) -> None:
        self.exits, self.passes = exits, passes

    def should_exit(self, row: RowView) -> bool:
        return row.layer in self.exits.open and self.passes(row.logits())   # reads only where open


@attrs.frozen
class ConfidenceOptions(WhereOptions):
    threshold: float = option(0.9, "exit once the top token's probability beats the "
                              "runner-up's by this much", between(0.0, 1.0), tune=(1.0, 0.0))


def confidence(options: ConfidenceOptions, num_layers: int) -> Confident:
    """CALM: exit once the early softmax's top-1 margin >= threshold (a head matmul a layer)."""
    return Confident(options.where(num_layers),
                     lambda logits: margin(logits) >= options.threshold)


@attrs.frozen
class EntropyOptions(WhereOptions):
    threshold: float = option(1.0, "exit once the early softmax's entropy (nats) is at most "
                              "this", between(0.0, 100.0), tune=(0.0, 8.0))


def entropy_policy(options: EntropyOptions, num_layers: int) -> Confident:
    """Exit once the early softmax's entropy <= threshold nats (a head matmul a layer)."""
    return Confident(options.where(num_layers),
                     lambda logits: entropy(logits) <= options.threshold)
