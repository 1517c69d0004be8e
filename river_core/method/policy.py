"""Exit policies: per decoding token and layer, does the token leave the backbone now?

A policy declares what it reads (`Needs`), so the decode step measures only that, and decides
from one row's view at one layer (`RowView`). Whatever a policy keeps per sequence lives in the
state its `new_row` makes, which the view carries; a policy object itself holds only its
settings, so one serves every row and every generation.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import attrs
import numpy as np

from ..settings.errors import ConfigError
from ..settings.options import at_least, between, option
from .predictor import SimilarityPredictor


@attrs.frozen
class Needs:
    """What a policy reads besides the layer and step."""

    similarity: bool = False
    """Each block's input/output cosine, fed to the row's predictor (`RowView.similarity`,
    `RowView.predicted_error`)."""
    sub_blocks: bool = False
    """The predictor observes, per backbone layer, the smaller of its attention and MLP
    sub-blocks' cosines instead of the whole block's (`Capabilities.sub_blocks`)."""
    recheck: bool = False
    """A second look at exited tokens' river logits (`ExitPolicy.recheck`): True sends a
    token back through the backbone from its exit (only where the KV strategy drafts)."""


@attrs.frozen
class RowView:
    """One sequence's token after backbone layer `layer` of decode step `step`."""

    layer: int
    step: int
    predictor: SimilarityPredictor
    state: Any   # what the policy's `new_row` made for this sequence
    _logits: Callable[[], np.ndarray] = attrs.field(alias="logits")

    @property
    def similarity(self) -> float:
        """The cosine observed last (the block's, or the smaller sub-block's)."""
        return self.predictor.last

    def predicted_error(self) -> float:
        """The predictor's cumulative K/V error of exiting now."""
        return self.predictor.predicted_error(self.layer)

    def logits(self) -> np.ndarray:
        """The token's [vocab] logits of its state here: the final norm and LM head, a
        head-sized matmul made on the first call at that layer (no flag turns it on: a
        policy pays only where it looks)."""
        return self._logits()


class ExitPolicy(Protocol):
    needs: Needs

    def new_row(self) -> Any:
        """A sequence's own state, made when it starts (None: the policy keeps none)."""

    def should_exit(self, row: RowView) -> bool:
        """Leave the backbone after `row.layer`?"""

    def recheck(self, logits: np.ndarray) -> bool:
        """With `Needs.recheck`: send an exited token with these river logits back through
        the backbone?"""


class Policy:
    """Defaults for the optional parts of `ExitPolicy`."""

    needs = Needs()

    def new_row(self) -> Any:
        return None

    def recheck(self, logits: np.ndarray) -> bool:
        return False


# -- options the policies share, declared once ----------------------------------------------

def min_layer_option(default: int | None = 1,
                     doc: str = "earliest layer a token may exit after") -> Any:
    return option(default, doc, at_least(-1))


def tau_option(default: float = 0.97, doc: str = "exit once both sub-blocks' input/output "
               "cosine exceed this", tune: tuple[float, float] | None = None) -> Any:
    return option(default, doc, between(-1.0, 1.0), tune=tune)


@attrs.frozen
class Exits:
    """Where a policy may let tokens out: `layer in exits.open` after each layer (a set, so
    the check on every layer of every token is no call)."""

    open: frozenset[int]


@attrs.frozen
class WhereOptions:
    """Where a policy may let tokens out: `min_layer`, and optionally a set of `layers`."""

    min_layer: int = min_layer_option()
    layers: list | None = option(None, "exit only after these layers, e.g. [3,7,11] "
                                 "(default: any)")

    def where(self, num_layers: int) -> Exits:
        check_min_layer(self.min_layer, num_layers)
        layers = self.layers
        if layers is not None and (not isinstance(layers, (list, tuple)) or not all(
                isinstance(k, int) and -1 <= k < num_layers - 1 for k in layers)):
            raise ConfigError(f"layers must be a list of exit layers in [-1, {num_layers - 2}], "
                              f"e.g. -o layers=[3,7,11]; got {layers!r}")
        return Exits(frozenset(k for k in range(-1, num_layers) if k >= self.min_layer and
                               (layers is None or k in layers)))


def check_min_layer(min_layer: int, num_layers: int) -> int:
    if min_layer >= num_layers:
        raise ConfigError(f"min_layer {min_layer} is past the model's last layer "
                          f"({num_layers - 1})")
    return min_layer


# -- the core's policies ----------------------------------------------------------------------

@attrs.frozen
class SettledOptions(WhereOptions):
    tau: float = tau_option(tune=(1.0, 0.5))


class SettledPolicy(Policy):
    """The paper's rule: exit once attention and MLP both have cos(input, output) > tau."""

    needs = Needs(similarity=True, sub_blocks=True)

    def __init__(self, options: SettledOptions, num_layers: int) -> None:
        self.tau, self.exits = options.tau, options.where(num_layers)

    def should_exit(self, row: RowView) -> bool:
        return row.layer in self.exits.open and row.similarity > self.tau


@attrs.frozen
class SimilarityOptions:
    threshold: float = option(0.15, "largest predicted cumulative KV error a token may exit "
                              "with", between(0.0, 10.0), tune=(0.0, 5.0))
    min_layer: int | None = min_layer_option(None, "earliest layer a token may exit after "
                                             "(default: a quarter of the depth)")


class SimilarityPolicy(Policy):
    """Exit at the first layer whose predicted cumulative KV error is <= threshold."""

    needs = Needs(similarity=True)

    def __init__(self, options: SimilarityOptions, num_layers: int) -> None:
        self.threshold = options.threshold
        self.min_layer = check_min_layer(num_layers // 4 if options.min_layer is None
                                         else options.min_layer, num_layers)

    def should_exit(self, row: RowView) -> bool:
        return row.layer >= self.min_layer and row.predicted_error() <= self.threshold


class ScriptedExits(Policy):
    """Step s leaves after layer `exits[s]` (None, or past the last layer: full depth). For
    measurements that must choose exits themselves: calibration's per-layer table, the kit."""

    def __init__(self, exits: Sequence[int | None]) -> None:
        self.exits = list(exits)

    def should_exit(self, row: RowView) -> bool:
        return row.step < len(self.exits) and self.exits[row.step] == row.layer
