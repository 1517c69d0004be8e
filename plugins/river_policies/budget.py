"""`budget`: the paper's rule with its threshold steered online to hold a target mean depth."""

import attrs

from river_core.options import between, option, takes

from .confidence import Layers, WhereOptions


class DepthBudget:
    """Exit where both sub-blocks' cosines exceed tau (the paper's rule); after each token,
    tau moves by `rate` * (target - layers it ran) / L, so a token deeper than the budget
    lowers the bar for the next one. Per sequence (a batch row keeps its own tau)."""

    uses_similarity, sub_blocks = True, True

    def __init__(self, target: float, rate: float, tau: float, layers: Layers,
                 num_layers: int) -> None:
        self.target, self.rate, self.start = target, rate, tau
        self.layers, self.num_layers = layers, num_layers
        self._rows: dict[int, list] = {}   # id(predictor) -> [tau, step, layers run]

    def tau(self, predictor) -> float:
        return self._rows.get(id(predictor), [self.start])[0]

    def should_exit(self, layer, step, predictor) -> bool:
        row = self._rows.setdefault(id(predictor), [self.start, step, None])
        if row[1] != step:   # a new token: the last one's depth steers tau
            if row[2] is not None:
                row[0] += self.rate * (self.target - row[2]) / self.num_layers
                row[0] = min(max(row[0], -1.0), 1.0)
            row[1] = step
        leave = self.layers.open(layer) and predictor.last > row[0]
        row[2] = layer + 1 if leave else layer + 2   # runs on: at least one more layer
        return leave


@attrs.frozen
class BudgetOptions(WhereOptions):
    target: float = option(4.0, "mean number of backbone layers a token should run",
                           between(0.0, 1000.0))
    rate: float = option(0.05, "how fast tau follows the depth error", between(0.0, 1.0))
    tau: float = option(0.97, "the threshold to start from", between(-1.0, 1.0))


@takes(BudgetOptions)
def budget(options: BudgetOptions, num_layers: int) -> DepthBudget:
    """The paper's rule, tau steered online to hold -o target=MEAN backbone layers."""
    return DepthBudget(options.target, options.rate, options.tau, options.where(num_layers),
                       num_layers)
